"""The data-parallel engine: ``RankedBackend`` on rank 0 (the API's ``Backend``), ``follow_leader`` on the others.

Rank 0 takes every request, as the in-process engine does, and turns each into one command that it broadcasts
and runs itself (``commands``); the other ranks run the same commands in the same order. Training requests are
split by tokens over the ranks (``split.balanced_shards``) and their gradients summed; the Adam step runs on every
rank; checkpoints are written by rank 0 only (its store); sampling requests are spread over the ranks, each
answered by one rank's sampler, in rounds: every sampling request queued when a round starts joins it.

Commands run on rank 0's engine thread (``LocalBackend.submit``), in submission order, one at a time, which also
keeps its collectives in one order. When a collective fails (a rank stopped), every pending and later request fails
with a ``RequestFailedError`` naming the rank, and ``on_failure`` is called once (``tinker-cookbook serve`` then
stops the server).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from tinker_cookbook.engine.backend import LocalBackend, _check_model_name, _check_rank, check_lora_config
from tinker_cookbook.engine.ranks import commands
from tinker_cookbook.engine.ranks.commands import RankEngine
from tinker_cookbook.engine.ranks.group import RankFailure, Ranks
from tinker_cookbook.engine.ranks.split import balanced_shards
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.engine.store.files import read_sampler_adapter
from tinker_cookbook.engine.training.custom_loss import CustomLossFn
from tinker_cookbook.engine.training.session import ForwardRequest
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import RequestFailedError, TinkerError

PING_S = 2.0
"""While idle, the leader sends a no-op command this often: a rank that stopped is then noticed within this time
even when no request comes, and idle ranks waiting for the next command never reach the collective timeout."""


class RankedSamplerHandle:
    """What a sampling client holds: the id of the sampling weights every rank keeps, and what the API shows."""

    def __init__(self, handle_id: int, base_model: str, model_path: str | None, tokenizer: Any) -> None:
        self.handle_id = handle_id
        self.base_model = base_model
        self.model_path = model_path
        self.tokenizer = tokenizer


class RankedBackend:
    """The API's ``Backend`` over the ranks of a process group; created on rank 0 (see the module docstring)."""

    def __init__(self, ranks: Ranks, store: CheckpointStore | None = None,
                 on_failure: Callable[[str], None] | None = None) -> None:
        if not ranks.is_leader:
            raise ValueError(f"RankedBackend runs on rank 0; rank {ranks.rank} runs follow_leader(ranks)")
        self.ranks = ranks
        self.local = LocalBackend(store, ranks.device)
        self.store = self.local.store
        self.engine = RankEngine(ranks, self.local)
        self._on_failure = on_failure
        self._broken: str | None = None
        self._handle_ids = itertools.count()
        # Filled by garbage-collection finalizers, which may run holding any lock: SimpleQueue.put takes none.
        self._released_handles: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._released_sessions: queue.SimpleQueue[str] = queue.SimpleQueue()
        # Each waiting request keeps its handle alive, so that its weights are not released before its round.
        self._samples: list[tuple[commands.SampleRequest, concurrent.futures.Future[types.SampleResponse],
                                  RankedSamplerHandle]] = []
        self._samples_lock = threading.Lock()
        self._last_command = time.monotonic()
        self._ping_queued = False
        self._closing = threading.Event()
        self._pinger = threading.Thread(target=self._ping_loop, name="tinker-cookbook-rank-ping", daemon=True)
        self._pinger.start()

    # -- the command stream ---------------------------------------------------------------------------------

    def _lead(self, command: commands.Command, custom: commands.CustomPart | None = None) -> Any:
        """Broadcast ``command`` and run it here (on the engine thread); the request's result or error."""
        if self._broken is not None:
            raise RequestFailedError(self._broken)
        try:
            self._send_releases()
            self._last_command = time.monotonic()
            if isinstance(command, commands.Ping):
                self._ping_queued = False
            self.ranks.broadcast(commands.for_followers(command))
            return self.engine.run(command, custom)
        except RankFailure as exc:
            self._fail(str(exc))
            raise RequestFailedError(str(exc)) from None

    def _send_releases(self) -> None:
        while True:
            try:
                handle_id = self._released_handles.get_nowait()
            except queue.Empty:
                break
            self.ranks.broadcast(commands.DropHandle(handle_id))
            self.engine.run(commands.DropHandle(handle_id))
        while True:
            try:
                run_id = self._released_sessions.get_nowait()
            except queue.Empty:
                break
            self.ranks.broadcast(commands.Drop(run_id))
            self.engine.run(commands.Drop(run_id))

    def _submit(self, command: commands.Command, custom: commands.CustomPart | None = None
                ) -> concurrent.futures.Future[Any]:
        return self.local.submit(lambda: self._lead(command, custom))

    def _fail(self, message: str) -> None:
        if self._broken is not None:
            return
        self._broken = message
        with self._samples_lock:
            waiting, self._samples = self._samples, []
        for _, future, _ in waiting:
            _settle(future, RequestFailedError(message))
        if self._on_failure is not None:
            self._on_failure(message)

    def _ping_loop(self) -> None:
        while not self._closing.wait(PING_S / 4):
            if self._broken is not None:
                return
            if not self._ping_queued and time.monotonic() - self._last_command >= PING_S:
                self._ping_queued = True  # one at a time: while a long request runs, none pile up behind it
                try:
                    self._submit(commands.Ping())
                except TinkerError:
                    return  # the engine closed meanwhile

    # -- service --------------------------------------------------------------------------------------------

    def capabilities(self) -> types.GetServerCapabilitiesResponse:
        return self.local.capabilities()

    def model_data(self, base_model: str) -> types.ModelData:
        return self.local.model_data(base_model)

    # -- training sessions ----------------------------------------------------------------------------------

    def create_session(self, base_model: str, lora: types.LoraConfig, user_metadata: dict[str, str] | None) -> str:
        _check_model_name(base_model)
        check_lora_config(lora)

        def create() -> str:
            _check_rank(lora.rank, self.local._base(base_model))
            run_id = self.store.create_run(base_model, lora, user_metadata)
            try:
                return str(self._lead(commands.Create(run_id, base_model, lora)))
            except BaseException:
                self.store.discard_new_run(run_id)  # a client that could not be built leaves no run behind
                raise

        return self.local.submit(create).result()

    def create_session_from_state(self, path: str, with_optimizer: bool, user_metadata: dict[str, str] | None
                                  ) -> tuple[str, str, types.LoraConfig]:
        meta = self.store.checkpoint_metadata(path)
        self.store.checkpoint_dir(path, expected_kind="weights")
        lora = types.LoraConfig(
            rank=int(meta["lora_rank"]), train_attn=bool(meta["train_attn"]), train_mlp=bool(meta["train_mlp"]),
            train_unembed=bool(meta["train_unembed"]), seed=0,
        )
        run_id = self.create_session(meta["base_model"], lora, user_metadata)
        try:
            self.load(run_id, path, with_optimizer).result()
        except Exception:
            self.close_session(run_id).result()
            self.store.discard_new_run(run_id)
            raise
        return run_id, meta["base_model"], lora

    def forward(self, run_id: str, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> concurrent.futures.Future[types.ForwardBackwardOutput]:
        def run() -> types.ForwardBackwardOutput:
            # The whole request is checked here first, so that an error names the datum by its index in it.
            prepared = self.engine.session(run_id).prepare_forward(
                ForwardRequest(data, loss_fn, loss_fn_config, backward))
            groups = balanced_shards([len(item.input_ids) for item in prepared.batch], self.ranks.world)
            shards = [[data[i] for i in group] for group in groups]
            return self._lead(commands.Forward(run_id, shards, groups, loss_fn, loss_fn_config, backward))  # type: ignore[no-any-return]

        return self.local.submit(run)

    def forward_backward_custom(self, run_id: str, data: list[types.Datum], loss_fn: CustomLossFn
                                ) -> concurrent.futures.Future[types.ForwardBackwardOutput]:
        return self._submit(commands.Custom(run_id), commands.custom_part(data, loss_fn))

    def optim_step(self, run_id: str, adam_params: types.AdamParams
                   ) -> concurrent.futures.Future[types.OptimStepResponse]:
        return self._submit(commands.Step(run_id, adam_params))

    def save(self, run_id: str, kind: str, name: str, ttl_seconds: int | None,
             overwrite: bool = False) -> concurrent.futures.Future[str]:
        # Every rank holds the same adapter and Adam state: rank 0 alone writes the checkpoint, in order.
        return self.local.save(run_id, kind, name, ttl_seconds, overwrite)

    def load(self, run_id: str, path: str, with_optimizer: bool
             ) -> concurrent.futures.Future[types.LoadWeightsResponse]:
        return self._submit(commands.Load(run_id, path, with_optimizer))

    def snapshot(self, run_id: str, name: str | None) -> concurrent.futures.Future[RankedSamplerHandle]:
        def take() -> RankedSamplerHandle:
            session = self.engine.session(run_id)
            path = None if name is None else session.save_to(self.store, "sampler_weights", name, None, True)
            handle_id = next(self._handle_ids)
            handle = self._lead(commands.Snapshot(run_id, handle_id))
            return self._client_handle(handle_id, handle.base_model, path, handle.tokenizer)

        return self.local.submit(take)

    def close_session(self, run_id: str) -> concurrent.futures.Future[None]:
        if self.local._closed or self._broken is not None:
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return done
        return self._submit(commands.Drop(run_id))

    def release_collected(self, run_id: str) -> None:
        self._released_sessions.put(run_id)  # sent with the next command (or ping): see _send_releases

    # -- sampling -------------------------------------------------------------------------------------------

    def _client_handle(self, handle_id: int, base_model: str, model_path: str | None,
                       tokenizer: Any) -> RankedSamplerHandle:
        handle = RankedSamplerHandle(handle_id, base_model, model_path, tokenizer)
        weakref.finalize(handle, self._released_handles.put, handle_id)
        return handle

    def handle_for_path(self, model_path: str) -> RankedSamplerHandle:
        directory = self.store.checkpoint_dir(model_path, expected_kind="sampler_weights")
        base_model = self.store.checkpoint_metadata(model_path)["base_model"]

        def open_handle() -> RankedSamplerHandle:
            base = self.local._base(base_model)
            state, config = read_sampler_adapter(directory, model_path, base.base_state, base.spec.name)
            handle_id = next(self._handle_ids)
            command = commands.OpenHandle(handle_id, base_model, {k: v.cpu() for k, v in state.items()}, config,
                                          model_path)
            handle = self._lead(command)
            return self._client_handle(handle_id, base_model, model_path, handle.tokenizer)

        return self.local.submit(open_handle).result()

    def handle_for_base(self, base_model: str) -> RankedSamplerHandle:
        _check_model_name(base_model)

        def open_handle() -> RankedSamplerHandle:
            handle_id = next(self._handle_ids)
            handle = self._lead(commands.OpenHandle(handle_id, base_model, None, None, None))
            return self._client_handle(handle_id, base_model, None, handle.tokenizer)

        return self.local.submit(open_handle).result()

    def sample(self, handle: RankedSamplerHandle, prompt: types.ModelInput, num_samples: int,
               params: types.SamplingParams, include_prompt_logprobs: bool, topk_prompt_logprobs: int
               ) -> concurrent.futures.Future[types.SampleResponse]:
        future: concurrent.futures.Future[types.SampleResponse] = concurrent.futures.Future()
        if self._broken is not None:
            future.set_exception(RequestFailedError(self._broken))
            return future
        request = commands.SampleRequest(0, 0, handle.handle_id, prompt, num_samples, params,
                                         include_prompt_logprobs, topk_prompt_logprobs)
        with self._samples_lock:
            self._samples.append((request, future, handle))
        try:
            self.local.submit(self._sample_round)
        except TinkerError as exc:  # closed
            if not future.done():
                future.set_exception(exc)
        return future

    def _sample_round(self) -> None:
        """Every sampling request queued now, each on one rank (balanced by the tokens it prefills and decodes)."""
        with self._samples_lock:
            taken, self._samples = self._samples, []
        if not taken:
            return  # an earlier round took them
        costs = [r.num_samples * (r.prompt.length + (r.params.max_tokens or 1)) for r, _, _ in taken]
        rank_of = {i: rank for rank, group in enumerate(balanced_shards(costs, self.ranks.world)) for i in group}
        requests = [commands.SampleRequest(i, rank_of[i], r.handle_id, r.prompt, r.num_samples, r.params,
                                           r.include_prompt_logprobs, r.topk_prompt_logprobs)
                    for i, (r, _, _) in enumerate(taken)]
        try:
            results = self._lead(commands.SampleRound(requests))
        except Exception as exc:  # noqa: BLE001 - every request of the round gets the error
            for _, future, _ in taken:
                _settle(future, exc)
            return
        for (_, future, _), result in zip(taken, results, strict=True):
            _settle(future, result)

    def describe_ranks(self) -> str:
        """One line naming every rank's process and device (the server's banner shows it)."""
        return ", ".join(f"rank {m.rank} pid {m.pid} on {m.host}" for m in self.ranks.members) + (
            f" ({self.ranks.world} ranks, rank 0 on {self.ranks.device})")

    # -- lifetime -------------------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Stop every rank (they leave ``follow_leader``), then this engine (idempotent)."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self._broken is None:
            try:
                self._submit(commands.Stop()).result(timeout)
            except concurrent.futures.TimeoutError:
                pass  # stuck in a request: closing the engine below fails what waits; the ranks see us go
            except TinkerError:
                # The engine thread is gone (interpreter exit): nothing else sends, so tell the ranks from here.
                with contextlib.suppress(RankFailure):
                    self.ranks.broadcast(commands.Stop())
        self.local.close(timeout)


def _settle(future: concurrent.futures.Future[Any], outcome: Any) -> None:
    """Complete ``future`` with a result or an exception, unless its caller cancelled it meanwhile."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def follow_leader(ranks: Ranks) -> None:
    """Run the leader's commands on this rank until it stops (``RankedBackend.close``); a ``RankFailure`` when
    the leader or another rank stops first."""
    if ranks.is_leader:
        raise ValueError("rank 0 leads: create a RankedBackend there")
    local = LocalBackend(CheckpointStore(), ranks.device)
    engine = RankEngine(ranks, local)

    def run(command: commands.Command) -> RankFailure | None:
        """One command; its failure only when it is a lost rank (a request's failure is rank 0's to report)."""
        try:
            engine.run(command)
        except RankFailure as exc:
            return exc
        except Exception:  # noqa: BLE001 - a request's failure: every rank agreed on it, rank 0 reports it
            pass
        return None

    try:
        while True:
            command = ranks.broadcast(None)
            if isinstance(command, commands.Stop):
                return
            failure = local.submit(functools.partial(run, command)).result()
            if failure is not None:
                raise failure
    finally:
        local.close(timeout=10)

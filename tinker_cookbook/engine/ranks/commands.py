"""What every rank runs: the commands of the leader's stream, each on the rank's own engine, in the same order.

Every rank holds the same training sessions (same adapter, Adam state and pending gradients, kept equal by the
commands below) and its own sampler. A command runs on every rank with the same control flow, so the collectives
inside it match up; only the leader touches the checkpoint store.

Training requests (``Forward``, ``Custom``) follow one rule, ``RankEngine.accumulate``: each rank adds its part's
gradients to zeroed ``.grad`` tensors, the ranks agree whether every part succeeded, and then one flat all-reduce
(a sum) of those gradients is added to every rank's pending gradients. The built-in losses are sums over tokens and
over datums (``training.losses``: any normalisation is baked into the weights or advantages), so the sum of the
ranks' gradients is the gradient of the whole batch. A request that fails on any rank leaves every rank's pending
gradients as they were (the engine's all-or-nothing rule, across ranks). The Adam step then runs on every rank on
identical gradients and state, so the adapters stay identical without sending them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tinker_cookbook.engine import handles as engine_handles
from tinker_cookbook.engine.backend import LocalBackend
from tinker_cookbook.engine.handles import SamplerHandle
from tinker_cookbook.engine.ranks.group import Ranks
from tinker_cookbook.engine.training.custom_loss import CustomLossFn
from tinker_cookbook.engine.training.session import TrainingSession
from tinker_cookbook.tinker import errors, types

# -- the commands (picklable: the leader broadcasts each one) ------------------------------------------------


@dataclass(frozen=True)
class Ping:
    """Nothing to do: sent while the leader is idle, so that a rank that stopped is noticed and idle ranks never
    reach the collective timeout."""


@dataclass(frozen=True)
class Stop:
    """The leader is closing: every rank leaves its loop."""


@dataclass(frozen=True)
class Create:
    run_id: str
    base_model: str
    lora: types.LoraConfig


@dataclass(frozen=True)
class Load:
    """The leader loads a checkpoint into the session; the others then take its state."""

    run_id: str
    path: str
    with_optimizer: bool


@dataclass(frozen=True)
class Drop:
    run_id: str


@dataclass(frozen=True)
class Forward:
    """A built-in-loss request; rank r runs ``shards[r]`` (validated by the leader, possibly empty), the datums
    at ``positions[r]`` of the request. The leader's copy holds every shard; the copy it broadcasts holds none
    (``for_followers``), and each rank receives its own shard by a scatter."""

    run_id: str
    shards: list[list[types.Datum]]
    positions: list[list[int]]
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    backward: bool


@dataclass(frozen=True)
class Custom:
    """A custom-loss request: the leader runs all of it (the loss is a function of the whole batch, held by the
    leader only); the other ranks add zero gradients."""

    run_id: str


@dataclass(frozen=True)
class Step:
    run_id: str
    adam_params: types.AdamParams


@dataclass(frozen=True)
class Snapshot:
    """Every rank takes sampling weights of its (identical) session as handle ``handle_id``."""

    run_id: str
    handle_id: int


@dataclass(frozen=True)
class OpenHandle:
    """Sampling weights of a base model with an optional adapter (read from the store by the leader)."""

    handle_id: int
    base_model: str
    adapter_state: dict[str, torch.Tensor] | None
    adapter_config: dict[str, Any] | None
    model_path: str | None


@dataclass(frozen=True)
class DropHandle:
    handle_id: int


@dataclass(frozen=True)
class SampleRequest:
    index: int
    rank: int
    handle_id: int
    prompt: types.ModelInput
    num_samples: int
    params: types.SamplingParams
    include_prompt_logprobs: bool
    topk_prompt_logprobs: int


@dataclass(frozen=True)
class SampleRound:
    """Sampling requests, each assigned to one rank; the answers are gathered on the leader."""

    requests: list[SampleRequest]


Command = (Ping | Stop | Create | Load | Drop | Forward | Custom | Step | Snapshot | OpenHandle | DropHandle
           | SampleRound)

def for_followers(command: Command) -> Command:
    """What the leader broadcasts for ``command``: a request's datums go to each rank by scatter instead, so that
    no rank receives the others' shards."""
    return dataclasses.replace(command, shards=[]) if isinstance(command, Forward) else command


# -- errors that cross ranks ---------------------------------------------------------------------------------


def portable(exc: BaseException) -> tuple[str, str]:
    """An exception as (class name, message), which always pickles."""
    return type(exc).__name__, str(exc)


def rebuilt(rank: int, error: tuple[str, str]) -> Exception:
    """The API error for another rank's ``portable`` error: the same class when it is one of the API's."""
    name, message = error
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.TinkerError):
        return cls(f"rank {rank}: {message}")
    return errors.RequestFailedError(f"rank {rank} failed: {name}: {message}")


# -- the engine of one rank ----------------------------------------------------------------------------------


class RankEngine:
    """One rank's engine (a ``LocalBackend`` on its device) and the commands it runs."""

    def __init__(self, ranks: Ranks, local: LocalBackend) -> None:
        self.ranks = ranks
        self.local = local
        self.handles: dict[int, SamplerHandle] = {}

    def session(self, run_id: str) -> TrainingSession:
        return self.local._session(run_id)

    def run(self, command: Command, custom: Callable[[TrainingSession], Any] | None = None) -> Any:
        """Run ``command`` on this rank; the leader gets the request's result (an API error if it failed on any
        rank), the other ranks None. ``custom``: the leader's part of a ``Custom`` request."""
        if isinstance(command, Ping | Stop):
            return None
        if isinstance(command, Create):
            return self._create(command)
        if isinstance(command, Load):
            return self._load(command)
        if isinstance(command, Drop):
            self.local._drop_session(command.run_id)
            return None
        if isinstance(command, Forward):
            return self._forward(command)
        if isinstance(command, Custom):
            session = self.session(command.run_id)
            return self.accumulate(session, (lambda: custom(session)) if custom is not None else None)
        if isinstance(command, Step):
            return self._step(command)
        if isinstance(command, Snapshot):
            self.handles[command.handle_id] = engine_handles.snapshot_handle(self.session(command.run_id), None)
            return self.handles[command.handle_id]
        if isinstance(command, OpenHandle):
            return self._open_handle(command)
        if isinstance(command, DropHandle):
            self.handles.pop(command.handle_id, None)
            return None
        if isinstance(command, SampleRound):
            return self._sample(command)
        raise errors.InternalServerError(f"unknown command {type(command).__name__} (an engine bug)")

    # -- agreement ----------------------------------------------------------------------------------------

    def agree(self, error: BaseException | None) -> None:
        """Raise, on every rank, the error of the lowest rank that failed (its own exception on the rank that had
        it); return on every rank when none failed."""
        outcomes = self.ranks.all_gather(None if error is None else portable(error))
        for rank, outcome in enumerate(outcomes):
            if outcome is not None:
                if rank == self.ranks.rank and error is not None:
                    raise error
                raise rebuilt(rank, outcome)

    # -- sessions -----------------------------------------------------------------------------------------

    def _create(self, command: Create) -> str:
        error: BaseException | None = None
        try:
            base = self.local._base(command.base_model)
            self.local._sessions[command.run_id] = TrainingSession(command.run_id, base, command.lora)
        except Exception as exc:  # noqa: BLE001 - every rank learns of it in agree()
            error = exc
        try:
            self.agree(error)
        except BaseException:
            self.local._drop_session(command.run_id)
            raise
        # Every rank starts from the leader's adapter (a seedless LoRA init differs from process to process).
        self.sync_from_leader(self.session(command.run_id))
        return command.run_id

    def _load(self, command: Load) -> types.LoadWeightsResponse | None:
        session = self.session(command.run_id)
        error: BaseException | None = None
        response = None
        if self.ranks.is_leader:
            try:
                response = session.load_from(self.local.store, command.path, command.with_optimizer)
            except Exception as exc:  # noqa: BLE001 - every rank learns of it in agree()
                error = exc
        self.agree(error)
        self.sync_from_leader(session)
        session._clear_grads()
        return response

    def sync_from_leader(self, session: TrainingSession) -> None:
        """The leader's adapter weights and Adam state (moments and step count), on every rank."""
        with torch.no_grad():
            for name, param in session.params.items():
                self.ranks.broadcast_tensor(param.data)
                self.ranks.broadcast_tensor(session.optimizer.exp_avg[name])
                self.ranks.broadcast_tensor(session.optimizer.exp_avg_sq[name])
        session.optimizer.step_count = int(self.ranks.broadcast(session.optimizer.step_count))

    # -- training -----------------------------------------------------------------------------------------

    def accumulate(self, session: TrainingSession, part: Callable[[], Any] | None) -> Any:
        """Run this rank's ``part`` of a training request (None: no part), then add every rank's gradients to each
        rank's pending gradients (see the module docstring); returns ``part``'s result."""
        saved, pending = session.saved_grads(), session.pending_backward
        for param in session.params.values():
            param.grad = None
        error: BaseException | None = None
        result = None
        try:
            if part is not None:
                result = part()
        except Exception as exc:  # noqa: BLE001 - every rank learns of it in agree()
            error = exc
        try:
            self.agree(error)
            self._sum_gradients(session, saved)
            # The summed gradients are bit-identical on every rank, so this check agrees without a collective.
            session.check_grads_finite("forward_backward")
        except BaseException:
            session.restore_grads(saved)
            session.pending_backward = pending
            raise
        session.pending_backward = pending + 1
        return result

    def _sum_gradients(self, session: TrainingSession, saved: dict[str, torch.Tensor | None]) -> None:
        """One flat all-reduce (per dtype) of this request's gradients, added to the earlier pending ones."""
        by_dtype: dict[torch.dtype, list[str]] = {}
        for name, param in session.params.items():
            by_dtype.setdefault(param.dtype, []).append(name)
        for names in by_dtype.values():
            params = [session.params[n] for n in names]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            self.ranks.all_reduce_sum(flat)
            offset = 0
            for name, param in zip(names, params, strict=True):
                grad = flat[offset:offset + param.numel()].view_as(param).clone()
                offset += param.numel()
                earlier = saved[name]
                param.grad = grad if earlier is None else earlier + grad

    def _forward(self, command: Forward) -> types.ForwardBackwardOutput | None:
        session = self.session(command.run_id)
        shard = self.ranks.scatter(command.shards if self.ranks.is_leader else None)

        def part() -> types.ForwardBackwardOutput | None:
            if not shard:
                return None
            return session.forward(shard, command.loss_fn, command.loss_fn_config, command.backward)

        if command.backward:
            output = self.accumulate(session, part)
        else:
            error: BaseException | None = None
            output = None
            try:
                output = part()
            except Exception as exc:  # noqa: BLE001 - every rank learns of it in agree()
                error = exc
            self.agree(error)
        outputs = self.ranks.gather(output)
        return None if outputs is None else merged_output(command, outputs)

    def _step(self, command: Step) -> types.OptimStepResponse | None:
        error: BaseException | None = None
        response = None
        try:
            response = self.session(command.run_id).optim_step(command.adam_params)
        except Exception as exc:  # noqa: BLE001 - identical state: every rank fails alike; agree() checks it
            error = exc
        self.agree(error)
        return response

    # -- sampling -----------------------------------------------------------------------------------------

    def _open_handle(self, command: OpenHandle) -> SamplerHandle:
        error: BaseException | None = None
        try:
            base = self.local._base(command.base_model)
            state = None if command.adapter_state is None else {
                k: v.to(base.device) for k, v in command.adapter_state.items()}
            self.handles[command.handle_id] = engine_handles.build_handle(base, state, command.adapter_config,
                                                                          command.model_path)
        except Exception as exc:  # noqa: BLE001 - every rank learns of it in agree()
            error = exc
        try:
            self.agree(error)
        except BaseException:
            self.handles.pop(command.handle_id, None)
            raise
        return self.handles[command.handle_id]

    def _sample(self, command: SampleRound) -> list[types.SampleResponse | Exception] | None:
        mine = [r for r in command.requests if r.rank == self.ranks.rank]
        futures: list[concurrent.futures.Future[types.SampleResponse] | Exception] = []
        for request in mine:
            try:
                futures.append(self.local.sample(self.handles[request.handle_id], request.prompt,
                                                 request.num_samples, request.params,
                                                 request.include_prompt_logprobs, request.topk_prompt_logprobs))
            except Exception as exc:  # noqa: BLE001 - this request's answer
                futures.append(exc)
        answers: list[tuple[int, Any]] = []
        for request, future in zip(mine, futures, strict=True):
            try:
                answers.append((request.index, future if isinstance(future, Exception) else future.result()))
            except Exception as exc:  # noqa: BLE001 - this request's answer
                answers.append((request.index, exc))
        portable_answers = [(i, portable(a) if isinstance(a, Exception) else a) for i, a in answers]
        gathered = self.ranks.gather(portable_answers)
        if gathered is None:
            return None
        results: list[types.SampleResponse | Exception] = [errors.RequestFailedError("unanswered")] * len(
            command.requests)
        ranks_of = {r.index: r.rank for r in command.requests}
        for rank_answers in gathered:
            for index, answer in rank_answers:
                results[index] = rebuilt(ranks_of[index], answer) if isinstance(answer, tuple) else answer
        return results


def merged_output(command: Forward, outputs: list[types.ForwardBackwardOutput | None]
                  ) -> types.ForwardBackwardOutput:
    """The ranks' outputs of their shards as one output in the request's datum order. ``loss:sum`` is the sum of
    the ranks' sums (the same total as one process, up to the order of the float additions)."""
    total = sum(len(shard) for shard in command.shards)
    items: list[Any] = [None] * total
    positions = command.positions
    loss = 0.0
    for rank, output in enumerate(outputs):
        if output is None:
            continue
        for position, item in zip(positions[rank], output.loss_fn_outputs, strict=True):
            items[position] = item
        loss += float(output.metrics.get("loss:sum", 0.0))
    return types.ForwardBackwardOutput(loss_fn_output_type=command.loss_fn, loss_fn_outputs=items,
                                       metrics={"loss:sum": loss})


CustomPart = Callable[[TrainingSession], types.ForwardBackwardOutput]


def custom_part(data: list[types.Datum], loss_fn: CustomLossFn) -> CustomPart:
    return lambda session: session.forward_backward_custom(data, loss_fn)

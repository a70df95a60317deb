"""Several training clients on one base: their queued forward_backward requests run in one batched pass
(``engine.training.multi_lora``), with results per client as if each ran alone."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from tinker_cookbook import tinker
from tinker_cookbook.engine.backend import LocalBackend
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, UnprocessableEntityError

MODEL = "tinker-cookbook/tiny-smollm2"
# Different ranks and target sets, all in one mixed pass.
CONFIGS: list[dict[str, Any]] = [
    dict(rank=4, seed=1),
    dict(rank=8, seed=2),
    dict(rank=2, seed=3, train_mlp=False, train_unembed=False),
    dict(rank=4, seed=4, train_attn=False),
]
ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-12)


@pytest.fixture
def engines() -> Iterator[tuple[LocalBackend, LocalBackend]]:
    """Two private engines with their own copy of the base: one batches, the other runs each client alone."""
    batched, solo = LocalBackend(), LocalBackend()
    yield batched, solo
    batched.close()
    solo.close()


def _client(backend: LocalBackend, config: dict[str, Any]) -> tinker.TrainingClient:
    lora = types.LoraConfig(**config)
    return tinker.TrainingClient(backend, backend.create_session(MODEL, lora, None), MODEL, lora)


def _batch(seed: int, n: int = 3) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(n):
        tokens = rng.integers(3, 2000, size=int(rng.integers(6, 40))).tolist()
        weights = [0.0] * 2 + [1.0] * (len(tokens) - 3)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs=dict(target_tokens=tokens[1:], weights=weights)))
    return data


@contextmanager
def _held(backend: LocalBackend) -> Iterator[None]:
    """Hold the engine's worker, so that everything submitted in the block is queued before it starts."""
    started, release = threading.Event(), threading.Event()

    def gate() -> None:
        started.set()
        release.wait(timeout=60)

    gate_future = backend.submit(gate)
    started.wait()
    try:
        yield
    finally:
        release.set()
        gate_future.result()
        backend.submit(lambda: None).result()  # queued after the block's requests: they have all run


def _weights_of(tc: tinker.TrainingClient) -> dict[str, torch.nn.Parameter]:
    return tc._backend._session(tc.model_id).params  # type: ignore[attr-defined]  # white-box: the adapter


def _weights(tc: tinker.TrainingClient) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in _weights_of(tc).items()}


def _logprobs(output: types.ForwardBackwardOutput) -> list[torch.Tensor]:
    return [out["logprobs"].to_torch() for out in output.loss_fn_outputs]


def _assert_same(batched: Any, solo: Any, what: str) -> None:
    """Equal up to fp32 rounding. The mixed pass computes the same per-row math as a solo pass, but in matmuls of
    other shapes (other rows in the batch, other padding widths, the LoRA product per segment), so BLAS sums in
    another order: each op differs by a few ulp (~1e-7 relative), which through a 2-layer model and the
    log-softmax stays far below 1e-4 (measured: 2e-6; losses, sums of ~100 such terms of size ~10: 5e-8 relative).
    Adam's update lr·m̂/√v̂ is a ratio of gradient sums: where a gradient element is near zero, or consecutive ones
    nearly cancel, that relative rounding is amplified; measured 1.5e-4·lr after 3 steps, so the bound is 1e-3·lr.
    (Rows through a wrong adapter, or an order change, move logprobs by ~1e-2 and weights by ~lr.)"""
    if isinstance(batched, types.ForwardBackwardOutput):
        assert isinstance(solo, types.ForwardBackwardOutput)
        torch.testing.assert_close(batched.metrics["loss:sum"], solo.metrics["loss:sum"], rtol=1e-5, atol=1e-4,
                                   msg=_label(f"{what} loss"))
        for i, (b, s) in enumerate(zip(_logprobs(batched), _logprobs(solo), strict=True)):
            torch.testing.assert_close(b, s, rtol=0, atol=1e-4, msg=_label(f"{what} logprobs[{i}]"))
    else:
        assert batched.keys() == solo.keys()
        for k in batched:
            torch.testing.assert_close(batched[k], solo[k], rtol=0, atol=1e-3 * ADAM.learning_rate,
                                       msg=_label(f"{what} {k}"))


def _label(what: str) -> Callable[[str], str]:
    return lambda message: f"{what}: {message}"


def _submit_steps(clients: dict[int, tinker.TrainingClient], steps: int) -> dict[int, list[Any]]:
    """Submit each client's forward_backward + optim_step per step without waiting; per client its futures.
    Client ``c`` trains on ``_batch(100 * c + step)``."""
    futures: dict[int, list[Any]] = {c: [] for c in clients}
    for step in range(steps):
        for c, tc in clients.items():
            futures[c].append(tc.forward_backward(_batch(100 * c + step), "cross_entropy"))
            futures[c].append(tc.optim_step(ADAM))
    return futures


def _results(futures: dict[int, list[Any]]) -> dict[int, list[Any]]:
    return {c: [f.result() for f in fs] for c, fs in futures.items()}


def test_four_clients_train_together_as_if_alone(engines: tuple[LocalBackend, LocalBackend]) -> None:
    batched, solo = engines
    steps = 3
    together = {c: _client(batched, config) for c, config in enumerate(CONFIGS)}
    with _held(batched):
        futures = _submit_steps(together, steps)
    results = _results(futures)
    # Every forward_backward ran in a pass shared with the other clients' (queued behind the held worker).
    assert batched.batched_requests == len(CONFIGS) * steps
    for c, config in enumerate(CONFIGS):
        alone = _client(solo, config)
        reference = _results(_submit_steps({c: alone}, steps))[c]
        for step in range(steps):
            _assert_same(results[c][2 * step], reference[2 * step], f"client {c} step {step}")
        _assert_same(_weights(together[c]), _weights(alone), f"client {c} weights")
    assert solo.batched_requests == 0


def test_a_bad_request_fails_alone(engines: tuple[LocalBackend, LocalBackend]) -> None:
    """Three ways to fail in one batch: a token outside the vocabulary (refused before the pass), a loss that
    overflows, and an adapter holding NaN (refused after it). Each fails alone, accumulating nothing; the other
    clients' results, in the same passes, are those of clients that never met them."""
    batched, solo = engines
    together = {c: _client(batched, config) for c, config in enumerate(CONFIGS)}
    with torch.no_grad():  # client 3's adapter is broken: NaN flows through its rows of the shared pass
        next(p for k, p in _weights_of(together[3]).items() if "lora_B" in k).fill_(float("nan"))
    outside = [*_batch(7), types.Datum(model_input=types.ModelInput.from_ints([5, 6, 10**6, 7]),
                                       loss_fn_inputs=dict(target_tokens=[6, 7, 8, 9], weights=[1.0] * 4))]
    overflow = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        **d.loss_fn_inputs, "weights": types.TensorData.from_torch(d.loss_fn_inputs["weights"].to_torch() * 3e38)})
        for d in _batch(8)]
    with _held(batched):
        first = {0: together[0].forward_backward(_batch(0), "cross_entropy"),
                 1: together[1].forward_backward(outside, "cross_entropy"),
                 2: together[2].forward_backward(overflow, "cross_entropy"),
                 3: together[3].forward_backward(_batch(300), "cross_entropy")}
        results = _submit_steps(together, 1)
    assert batched.batched_requests == 3 + 4  # the vocabulary check refuses client 1's first request up front
    with pytest.raises(BadRequestError, match="outside the vocabulary"):
        first[1].result()
    with pytest.raises(UnprocessableEntityError, match="loss"):
        first[2].result()
    for failed in (first[3], results[3][0]):
        with pytest.raises(UnprocessableEntityError, match="loss"):
            failed.result()
    with pytest.raises(BadRequestError, match="no accumulated gradients"):
        results[3][1].result()
    for c in (0, 1, 2):
        alone = _client(solo, CONFIGS[c])
        if c == 0:
            _assert_same(first[0].result(), alone.forward_backward(_batch(0), "cross_entropy").result(), "first")
        reference = _results(_submit_steps({c: alone}, 1))[c]
        _assert_same(results[c][0].result(), reference[0], f"client {c}")
        _assert_same(_weights(together[c]), _weights(alone), f"client {c} weights")


def test_each_clients_order_is_kept(engines: tuple[LocalBackend, LocalBackend]) -> None:
    """Only a client's next request joins another's batch: A's second forward_backward, queued behind A's
    optim_step, runs after that step, and forwards batch with forwards, not with forward_backward."""
    batched, solo = engines
    x, y = _batch(1), _batch(2)

    def requests(a: tinker.TrainingClient, b: tinker.TrainingClient) -> list[Callable[[], Any]]:
        return [lambda: b.forward_backward(y, "cross_entropy"), lambda: a.forward_backward(x, "cross_entropy"),
                lambda: a.optim_step(ADAM), lambda: a.forward_backward(x, "cross_entropy"), lambda: b.optim_step(ADAM),
                lambda: a.forward(y, "cross_entropy"), lambda: b.forward(x, "cross_entropy")]

    a, b = _client(batched, CONFIGS[0]), _client(batched, CONFIGS[1])
    with _held(batched):
        futures = [request() for request in requests(a, b)]
    results = [f.result() for f in futures]
    # b's and a's first forward_backward together, then a's forwards with b's; a's second one alone (b's next
    # request is its optim_step).
    assert batched.batched_requests == 4
    a_solo, b_solo = _client(solo, CONFIGS[0]), _client(solo, CONFIGS[1])
    reference = [request().result() for request in requests(a_solo, b_solo)]  # one at a time: nothing to batch
    assert solo.batched_requests == 0
    for i in (0, 1, 3, 5, 6):
        _assert_same(results[i], reference[i], f"request {i}")
    for tc, ref in ((a, a_solo), (b, b_solo)):
        _assert_same(_weights(tc), _weights(ref), "weights")
    # a's step lies between its two forward_backwards on the same data (else the comparison above proves little).
    assert not torch.allclose(_logprobs(results[1])[0], _logprobs(results[3])[0], atol=1e-3)


def test_a_mixed_group_is_never_larger_than_a_members_largest_solo_group(
        engines: tuple[LocalBackend, LocalBackend], group_sizes: list[int]) -> None:
    """Memory: a pass's activations grow with its padded size, so batching clients must not make groups larger
    than the largest one any of them would run alone (without the cap, four small batches form one big group)."""
    from tinker_cookbook.engine.training import passes

    batched, _ = engines
    clients = [_client(batched, config) for config in CONFIGS]
    batches = [_batch(100 + i, n=2) for i in range(len(clients))]
    with _held(batched):
        futures = [tc.forward_backward(batch, "cross_entropy") for tc, batch in zip(clients, batches, strict=True)]
    for future in futures:
        future.result()
    assert batched.batched_requests == len(clients)
    solo_cap = max(passes.largest_group_tokens([b.model_input.length for b in batch]) for batch in batches)
    assert group_sizes and max(group_sizes) <= solo_cap
    union = [b.model_input.length for batch in batches for b in batch]
    assert passes.largest_group_tokens(union) > solo_cap  # the case the cap is for


def test_a_mixed_pass_runs_its_largest_group_first(engines: tuple[LocalBackend, LocalBackend],
                                                   group_sizes: list[int]) -> None:
    """Memory: the heap keeps its high-water mark, and groups run smallest first raise it group by group around
    what the earlier ones left behind; the largest group first sets it once (``passes.largest_first``)."""

    batched, _ = engines
    clients = [_client(batched, config) for config in CONFIGS]
    with _held(batched):
        futures = [tc.forward_backward(_batch(200 + i, n=4), "cross_entropy") for i, tc in enumerate(clients)]
    for future in futures:
        future.result()
    assert batched.batched_requests == len(clients)
    assert len(set(group_sizes)) > 2  # groups of several sizes, so that the order is tested
    assert group_sizes == sorted(group_sizes, reverse=True)


def _saved_for_backward(run: Callable[[], Any], params: list[torch.nn.Parameter]) -> tuple[int, int]:
    """(bytes, count) of the distinct storages autograd saves for backward during ``run``, ``params`` left out.

    Each storage is held until the end, so that no freed one's address is reused by a later one and counted once.
    """
    skip = {p.untyped_storage().data_ptr() for p in params}
    held: dict[int, Any] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            held[storage.data_ptr()] = storage
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(s.nbytes() for s in held.values()), len(held)


def _mixed_and_solo(backend: LocalBackend, clients: list[tinker.TrainingClient]
                    ) -> tuple[Callable[[], Any], Callable[[], Any], list[torch.nn.Parameter]]:
    """The same rows (two of each of 4 ``clients``, adapters of one shape) in one pass: each row through its own
    client's adapter (mixed), or all through client 0's (solo); and every adapter parameter."""
    from tinker_cookbook.engine.training import forward, multi_lora
    from tinker_cookbook.engine.training.session import ForwardRequest

    sessions = [backend._session(tc.model_id) for tc in clients]
    prepared = [s.prepare_forward(ForwardRequest(_batch(300 + i, n=2), "cross_entropy", None, True))
                for i, s in enumerate(sessions)]
    items = [item for p in prepared for item in p.batch]
    token_losses = [loss for p in prepared for loss in p.token_losses()]
    names = [p.session.run_id for p in prepared for _ in p.batch]
    base = sessions[0].base
    layers = base.lora_layers()
    trainable = {f"{s.run_id}/{k}": p for s in sessions for k, p in s.params.items()}

    def mixed() -> None:
        model = base.activate(sessions[0].run_id)
        with multi_lora.no_active_adapter(layers, trainable):
            forward.run_group(base, model, items, token_losses, row_adapters=names)

    def solo() -> None:
        model = base.activate(sessions[0].run_id)
        with multi_lora.one_adapter(layers, sessions[0].run_id, sessions[0].params):
            forward.run_group(base, model, items, token_losses)

    return mixed, solo, list(trainable.values())


def _same_shape_clients(backend: LocalBackend) -> list[tinker.TrainingClient]:
    """4 clients whose adapters have one shape (the caller keeps them: a collected client closes its session)."""
    return [_client(backend, dict(rank=4, seed=10 + i)) for i in range(4)]


def test_a_mixed_pass_saves_for_backward_what_a_solo_pass_of_the_same_rows_saves(
        engines: tuple[LocalBackend, LocalBackend]) -> None:
    """Memory: a pass's activations kept for the backward are most of a step's peak. Rows that each go through
    their own adapter keep exactly what the same rows through one adapter keep, when the adapters have the same
    shapes (per layer the input, shared by all segments as views of one tensor, and the rank-r product of each
    row, with the rows split among the adapters): no per-segment copies, index tensors or zero fills. Only the
    adapters' own weights, left out here, differ (4 adapters instead of 1)."""
    batched, _ = engines
    clients = _same_shape_clients(batched)
    mixed, solo, params = _mixed_and_solo(batched, clients)
    mixed_bytes, mixed_count = _saved_for_backward(mixed, params)
    solo_bytes, solo_count = _saved_for_backward(solo, params)
    assert solo_bytes > 0
    assert mixed_bytes == solo_bytes
    # Tensors (not bytes): each adapted layer's rank-r product once per segment instead of once.
    assert mixed_count <= solo_count + 3 * len(params)


def _vocabulary_wide_outputs(run: Callable[[], Any], vocab_size: int) -> int:
    """How many new (not view or in-place) tensors of vocabulary width the ops of ``run`` create, backward included."""
    from torch.utils._python_dispatch import TorchDispatchMode

    count = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            nonlocal count
            out = func(*args, **(kwargs or {}))
            fresh = all(r.alias_info is None for r in func._schema.returns)
            outs = out if isinstance(out, (tuple, list)) else [out]
            count += sum(1 for o in outs if fresh and isinstance(o, torch.Tensor) and o.dim() >= 1
                         and o.shape[-1] == vocab_size)
            return out

    with Count():
        run()
    return count


def test_a_mixed_pass_makes_no_more_vocabulary_wide_tensors_than_a_solo_pass(
        engines: tuple[LocalBackend, LocalBackend]) -> None:
    """Memory: the unembedding's [tokens, vocabulary] tensors are the largest of a step, made while every
    activation of the pass is held for the backward. A row through its own adapter makes as many as a row of a
    client alone (the base logits, their sum with the LoRA product, the backward's softmax); peft's
    ``base + B(A(x)) * scaling`` made three more per chunk."""
    batched, _ = engines
    clients = _same_shape_clients(batched)
    mixed, solo, _ = _mixed_and_solo(batched, clients)
    vocab = batched._session(clients[0].model_id).base.vocab_size
    solo_count = _vocabulary_wide_outputs(solo, vocab)
    assert solo_count > 0
    assert _vocabulary_wide_outputs(mixed, vocab) == solo_count

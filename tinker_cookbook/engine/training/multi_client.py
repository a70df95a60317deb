"""Several training clients' queued requests on one base, run together (``forward_together``).

The backend's worker hands over built-in-loss ``forward`` / ``forward_backward`` requests of different sessions that
may run side by side; each runs as if alone (its own validation, results, gradients and all-or-nothing rule), in
one pass through the shared base per length group, each row through its own adapter (``multi_lora``).
"""

from __future__ import annotations

import torch

from tinker_cookbook.engine.device import fast_fp32_matmuls
from tinker_cookbook.engine.training import forward, multi_lora, passes
from tinker_cookbook.engine.training.base_model import BaseModel
from tinker_cookbook.engine.training.session import ForwardRequest, Outcome, PreparedForward, TrainingSession
from tinker_cookbook.tinker.errors import TinkerError


def forward_together(requests: list[tuple[TrainingSession, ForwardRequest]]) -> tuple[list[Outcome], int]:
    """Built-in-loss requests of different sessions (all ``backward`` or all not), each as if it ran alone.

    Returns each request's outcome and how many of them ran in a mixed pass. Each request is validated on its own
    (a refused one fails alone). Requests of sessions on one dense, text-only base then run together: one pass
    through the base per length group, rows of several sessions side by side, each row through its own adapter
    (``multi_lora``); the sessions' gradients are separate parameters, so each lands where it belongs, and the
    all-or-nothing rule holds per session. A request with images, on a vision or mixture-of-experts base, or alone
    on its base runs by itself, as does every request when the adapters use a LoRA feature ``multi_lora`` does not
    reproduce. Sessions whose ranks or target sets (train_attn/train_mlp/train_unembed) differ do mix.
    """
    outcomes: list[Outcome | None] = [None] * len(requests)
    by_base: dict[int, list[tuple[int, PreparedForward]]] = {}
    for i, (session, request) in enumerate(requests):
        try:
            prepared = session.prepare_forward(request)
        except Exception as exc:  # noqa: BLE001 - each request's failure is its own; the caller reports it
            outcomes[i] = exc
            continue
        # A loss with sequence statistics needs a first pass of its own (``run_prepared``), so it runs alone.
        if (any(item.images for item in prepared.batch) or not _mixable_base(session.base)
                or prepared.spec.sequence_inputs is not None):
            outcomes[i] = _run_alone(prepared)
        else:
            by_base.setdefault(id(session.base), []).append((i, prepared))
    mixed = 0
    for members in by_base.values():
        base = members[0][1].session.base
        names = [prepared.session.run_id for _, prepared in members]
        if len(members) > 1 and multi_lora.supports(base.lora_layers(), names):
            for (i, _), outcome in zip(members, _run_mixed([prepared for _, prepared in members]), strict=True):
                outcomes[i] = outcome
            mixed += len(members)
        else:
            for i, prepared in members:
                outcomes[i] = _run_alone(prepared)
    return [o if o is not None else RuntimeError("request not run (an engine bug)") for o in outcomes], mixed


def _run_alone(prepared: PreparedForward) -> Outcome:
    try:
        return prepared.session.run_prepared(prepared)
    except Exception as exc:  # noqa: BLE001 - the caller reports it as this request's failure
        return exc


def _mixable_base(base: BaseModel) -> bool:
    """Whether every adapted layer of ``base`` sees batch rows on dim 0 in a text pass: dense text decoders do;
    mixture-of-experts layers route flattened tokens, and vision towers are left out to keep to what is tested."""
    model_type = str(getattr(base.config, "model_type", ""))
    return not base.is_vision and not model_type.endswith("_moe")


def _run_mixed(members: list[PreparedForward]) -> list[Outcome]:
    """One mixed run of requests of different sessions on one base (see ``forward_together``)."""
    base = members[0].session.base
    backward = members[0].request.backward
    sessions = [prepared.session for prepared in members]
    rows = [(k, j) for k, prepared in enumerate(members) for j in range(len(prepared.batch))]
    items = [members[k].batch[j] for k, j in rows]
    losses_by_member = [prepared.token_losses() for prepared in members] if backward else None
    logps: list[list[torch.Tensor]] = [[torch.empty(0)] * len(prepared.batch) for prepared in members]
    totals: list[list[float]] = [[0.0] * len(prepared.batch) for prepared in members]
    saved = [session.saved_grads() for session in sessions] if backward else []
    trainable = {f"{s.run_id}/{k}": p for s in sessions for k, p in s.params.items()} if backward else {}
    layers = base.lora_layers()
    model = base.activate(sessions[0].run_id)  # the wrapped HF model; no_active_adapter then disables them all
    # A mixed group is never larger than the largest group a member would run alone: the activations of a pass
    # (the bulk of a step's memory) then stay those of one client, whatever the number of clients batched.
    cap = max(passes.largest_group_tokens([len(item.input_ids) for item in prepared.batch]) for prepared in members)
    try:
        with multi_lora.no_active_adapter(layers, trainable):
            for group in passes.largest_first(passes.length_groups([len(item.input_ids) for item in items], cap),
                                       [len(item.input_ids) for item in items]):
                group = sorted(group, key=lambda r: rows[r][0])  # each session's rows contiguous (stable sort)
                group_losses = None
                if losses_by_member is not None:
                    group_losses = [losses_by_member[rows[r][0]][rows[r][1]] for r in group]
                names = [sessions[rows[r][0]].run_id for r in group]
                with fast_fp32_matmuls(base.device):
                    group_logps, group_totals = forward.run_group(
                        base, model, [items[r] for r in group], group_losses, row_adapters=names)
                for r, logp, total in zip(group, group_logps, group_totals, strict=True):
                    k, j = rows[r]
                    logps[k][j], totals[k][j] = logp, total
    except BaseException:
        for session, grads in zip(sessions, saved, strict=True):
            session.restore_grads(grads)
        raise
    outcomes: list[Outcome] = []
    for k, prepared in enumerate(members):
        if not backward:
            outcomes.append(prepared.output(logps[k], None))
            continue
        session = prepared.session
        try:
            session.accept_backward(totals[k])
        except TinkerError as exc:
            session.restore_grads(saved[k])
            outcomes.append(exc)
            continue
        outcomes.append(prepared.output(logps[k], totals[k]))
    return outcomes

"""Training sessions: one training client's LoRA adapter on a shared base, its AdamW state and pending gradients.

Each training client is a ``TrainingSession``: a named peft adapter on a ``BaseModel`` (one per base model and
process), its optimizer and its gradients. Sessions never see each other's parameters: the engine runs one request
at a time and activates the request's adapter first, or runs built-in-loss requests of several sessions in one pass
(``multi_client.forward_together``) with each row routed through its own session's adapter (``multi_lora``).
A request is all or nothing: one that is refused (bad data, non-finite loss or gradients) leaves the pending
gradients as they were. The passes themselves are ``forward``'s; checkpoint files are ``store.files``'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tinker_cookbook.engine.store import files
from tinker_cookbook.engine.store.names import CheckpointKind
from tinker_cookbook.engine.training import custom_loss, forward, losses, validation
from tinker_cookbook.engine.training.base_model import BaseModel
from tinker_cookbook.engine.training.forward import TokenLoss
from tinker_cookbook.engine.training.optimizer import AdamW, InvalidState, NonFiniteStep
from tinker_cookbook.engine.training.validation import DatumTensors
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, InternalServerError, UnprocessableEntityError

if TYPE_CHECKING:
    from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore


@dataclass(frozen=True)
class ForwardRequest:
    """A ``forward`` / ``forward_backward`` request with a built-in loss, as the client sent it (unchecked)."""

    data: Any
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    backward: bool


@dataclass
class PreparedForward:
    """A validated built-in-loss request: its session, loss and data tensors."""

    session: TrainingSession
    request: ForwardRequest
    spec: losses.LossSpec
    config: dict[str, float]
    batch: list[DatumTensors]

    def token_losses(self) -> list[TokenLoss]:
        def token_loss(item: DatumTensors) -> TokenLoss:
            reach = self.spec.reach(item.inputs) if self.spec.reach is not None else None
            return TokenLoss(lambda logp, span: self.spec.fn(logp, {k: v[span] for k, v in item.inputs.items()},
                                                             self.config), reach)

        return [token_loss(item) for item in self.batch]

    def add_sequence_inputs(self, logps: list[torch.Tensor]) -> None:
        """The sequence-level inputs of a loss that has them (``LossSpec.sequence_inputs``), from the logprobs of
        a pass over the same data; BadRequestError naming the datum they cannot be computed for."""
        make = self.spec.sequence_inputs
        if make is None:
            return
        for i, (lp, item) in enumerate(zip(logps, self.batch, strict=True)):
            try:
                item.inputs.update(make(lp.detach().to(item.inputs["target_tokens"].device), item.inputs))
            except ValueError as exc:
                raise BadRequestError(f"data[{i}].{exc}") from None

    def output(self, logps: list[torch.Tensor], totals: list[float] | None) -> types.ForwardBackwardOutput:
        """The response; ``totals`` (the per-datum losses of a backward pass) or None: computed from the logprobs."""
        if totals is None:
            self.add_sequence_inputs(logps)
            totals = [float(self.spec.fn(lp, item.inputs, self.config)) for lp, item in zip(logps, self.batch,
                                                                                            strict=True)]
        return types.ForwardBackwardOutput(
            loss_fn_output_type=self.request.loss_fn,
            loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(lp.float())} for lp in logps],
            metrics={"loss:sum": sum(totals)},
        )



@dataclass
class TrainingSession:
    """One training client's adapter, optimizer and pending gradients."""

    run_id: str
    base: BaseModel
    lora: types.LoraConfig
    optimizer: AdamW = field(init=False)
    pending_backward: int = 0

    def __post_init__(self) -> None:
        self.base.add_adapter(self.run_id, self.lora)
        self.params = self.base.adapter_params(self.run_id)
        self.optimizer = AdamW(self.params)

    def forward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None, backward: bool
    ) -> types.ForwardBackwardOutput:
        return self.run_prepared(self.prepare_forward(ForwardRequest(data, loss_fn, loss_fn_config, backward)))

    def prepare_forward(self, request: ForwardRequest) -> PreparedForward:
        """Everything about a built-in-loss request that can be refused before the model runs."""
        spec = losses.get_loss(request.loss_fn)
        config = losses.resolve_config(request.loss_fn, request.loss_fn_config)
        batch = validation.datum_batch(self.base, request.data, spec.required_inputs)
        return PreparedForward(self, request, spec, config, batch)

    def run_prepared(self, prepared: PreparedForward) -> types.ForwardBackwardOutput:
        """One built-in-loss request on its own: the session's adapter active on every row."""
        model = self.base.activate(self.run_id)
        if prepared.request.backward:
            if prepared.spec.sequence_inputs is not None:
                # A first pass without gradients gives the sequence statistics the per-token terms read.
                first, _ = forward.run_batch(self.base, self.run_id, self.params, model, prepared.batch, None)
                prepared.add_sequence_inputs(first)
            with self._all_or_nothing():
                logps, totals = forward.run_batch(self.base, self.run_id, self.params, model, prepared.batch, prepared.token_losses())
                self.accept_backward(totals)
            return prepared.output(logps, totals)
        logps, _ = forward.run_batch(self.base, self.run_id, self.params, model, prepared.batch, None)
        return prepared.output(logps, None)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: custom_loss.CustomLossFn
                                ) -> types.ForwardBackwardOutput:
        """A user loss on per-datum logprobs, applied through the linear surrogate sum(dL/dlogp · logp).

        Pass 1 computes logprobs without a graph; the user's loss runs on leaf copies of them and autograd gives
        g = dL/dlogp; pass 2 backpropagates sum(g · logp). The gradient equals direct autograd of the loss while
        the graph of only one group of sequences is alive at a time. Everything the user's function returns is
        checked before pass 2, so a rejected loss accumulates nothing.
        """
        if not callable(loss_fn):
            raise BadRequestError(f"loss_fn={validation.short(loss_fn)} is not callable; pass a function "
                                  "(data, logprobs) -> (scalar loss tensor, metrics dict of floats)")
        batch = validation.datum_batch(self.base, data, ("target_tokens",))
        model = self.base.activate(self.run_id)
        logps, _ = forward.run_batch(self.base, self.run_id, self.params, model, batch, None)
        # The user's function sees CPU tensors whatever the engine's device (it may mix in its own tensors).
        logps = [lp.cpu() for lp in logps]
        loss, metrics, weights = custom_loss.run_custom_loss(loss_fn, list(data), logps)
        with self._all_or_nothing():
            forward.run_batch(self.base, self.run_id, self.params, model, batch, [custom_loss.surrogate(g.to(self.base.device)) for g in weights])
            self.check_grads_finite("forward_backward_custom")
        self.pending_backward += 1
        outputs = [{"logprobs": types.TensorData.from_torch(lp.float())} for lp in logps]
        return types.ForwardBackwardOutput(loss_fn_output_type="custom", loss_fn_outputs=outputs,
                                           metrics={"loss:sum": loss, **metrics})

    # -- gradients and optimizer ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Restore the pending gradients if the block fails: a rejected request accumulates nothing."""
        saved = self.saved_grads()
        try:
            yield
        except BaseException:
            self.restore_grads(saved)
            raise

    def saved_grads(self) -> dict[str, torch.Tensor | None]:
        """Copies of the pending gradients, for ``restore_grads``."""
        return {k: (p.grad.clone() if p.grad is not None else None) for k, p in self.params.items()}

    def restore_grads(self, saved: dict[str, torch.Tensor | None]) -> None:
        """Put back the pending gradients of ``saved_grads`` (a refused request accumulates nothing)."""
        for k, p in self.params.items():
            p.grad = saved[k]

    def check_grads_finite(self, request: str) -> None:
        """Refuse gradients (this request's plus those accumulated before it) that hold NaN or inf."""
        bad = [k for k, p in self.params.items() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        if bad:
            raise UnprocessableEntityError(
                f"{request} refused: the gradients (added to those accumulated since the last optim_step) hold NaN "
                f"or inf in {len(bad)} tensors, e.g. {bad[0]}; nothing was accumulated. Make the loss smaller "
                "(scale weights/advantages down) or call optim_step between large batches"
            )

    def accept_backward(self, totals: list[float]) -> None:
        """Count a backward pass whose gradients were just added (``totals``: its per-datum losses), after checking
        that the losses and the gradients are finite; an UnprocessableEntityError otherwise (the caller then puts
        the earlier gradients back)."""
        forward.check_losses_finite(totals)
        self.check_grads_finite("forward_backward")
        self.pending_backward += 1

    def _clear_grads(self) -> None:
        for p in self.params.values():
            p.grad = None
        self.pending_backward = 0

    def optim_step(self, hp: types.AdamParams) -> types.OptimStepResponse:
        validation.validate_adam(hp)
        if self.pending_backward == 0:
            raise BadRequestError("optim_step called with no accumulated gradients; call forward_backward first")
        try:
            metrics = self.optimizer.step(hp)
        except NonFiniteStep as exc:
            # Kept, these gradients would fail every later step too: drop them so that training can go on.
            self._clear_grads()
            raise UnprocessableEntityError(
                f"optim_step refused: {exc}. The weights, Adam state and step count are unchanged, and the "
                "accumulated gradients were discarded: run forward_backward on the next batch and call optim_step "
                "again"
            ) from None
        self._clear_grads()
        return types.OptimStepResponse(metrics=metrics)

    # -- checkpoints ------------------------------------------------------------------------------------

    def write_adapter(self, directory: Path) -> None:
        """A ``sampler_weights/`` checkpoint's files: the adapter and its PEFT config."""
        files.write_adapter(directory, self.base.adapter_state(self.run_id), self.base.adapter_config_dict(self.run_id))

    def write_state(self, directory: Path) -> None:
        """A ``weights/`` checkpoint's files: the adapter, its config and the Adam state."""
        self.write_adapter(directory)
        files.write_optimizer(directory, self.optimizer.state_tensors())

    def load_state(self, directory: Path, with_optimizer: bool, source: str) -> None:
        """Adopt a ``weights/`` checkpoint (``source``: its tinker:// path, for messages).

        Every file is read and checked (keys, shapes, dtypes, finite values) before anything changes, so a damaged
        checkpoint leaves the session exactly as it was.
        """
        adapter_label = f"{source}/{files.ADAPTER_WEIGHTS_FILE}"
        adapter = files.read_tensors(directory / files.ADAPTER_WEIGHTS_FILE, adapter_label)
        self.base.check_adapter_state(self.run_id, adapter, adapter_label)
        optimizer = AdamW(self.params)
        if with_optimizer:
            label = f"{source}/{files.OPTIMIZER_FILE}"
            if not (directory / files.OPTIMIZER_FILE).exists():
                raise BadRequestError(f"{label} is missing, so this checkpoint has no Adam state; load its weights "
                                      "only with load_state, or resume from a checkpoint written by save_state")
            try:
                optimizer.load_state_tensors(files.read_tensors(directory / files.OPTIMIZER_FILE, label))
            except InvalidState as exc:
                raise BadRequestError(f"{label} does not fit this adapter: {exc}; load an earlier checkpoint, or "
                                      "its weights only with load_state") from None
        self.base.load_adapter_state(self.run_id, adapter, adapter_label)
        self._clear_grads()
        self.optimizer = optimizer

    def save_to(self, store: CheckpointStore, kind: str, name: str, ttl_seconds: int | None, overwrite: bool) -> str:
        """Save a ``weights/`` (``write_state``) or ``sampler_weights/`` (``write_adapter``) checkpoint of the
        session in ``store``; returns its tinker:// path."""
        if kind not in ("weights", "sampler_weights"):
            raise InternalServerError(f"save: unknown checkpoint kind {kind!r} (an engine bug)")
        checkpoint_kind: CheckpointKind = "weights" if kind == "weights" else "sampler_weights"
        writer = self.write_state if kind == "weights" else self.write_adapter
        checkpoint = store.write_checkpoint(
            self.run_id, checkpoint_kind, name, writer, self.metadata(), ttl_seconds=ttl_seconds, overwrite=overwrite
        )
        return checkpoint.tinker_path

    def load_from(self, store: CheckpointStore, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        """Adopt the ``weights/`` checkpoint ``path`` of ``store``, which must be of this session's base model."""
        meta = store.checkpoint_metadata(path)
        if meta.get("base_model") != self.base.spec.name:
            raise BadRequestError(f"{path} was trained on {meta.get('base_model')!r}, but this client's base model is "
                                  f"{self.base.spec.name!r}; create a client with create_training_client_from_state")
        self.load_state(store.checkpoint_dir(path, expected_kind="weights"), with_optimizer, path)
        return types.LoadWeightsResponse(path=path, type="load_weights")

    def metadata(self) -> dict[str, Any]:
        return {
            "base_model": self.base.spec.name,
            "lora_rank": self.lora.rank,
            "train_attn": self.lora.train_attn,
            "train_mlp": self.lora.train_mlp,
            "train_unembed": self.lora.train_unembed,
            "optimizer_step": self.optimizer.step_count,
        }

    def close(self) -> None:
        self.base.remove_adapter(self.run_id)



Outcome = types.ForwardBackwardOutput | BaseException
"""A request's response, or the exception it failed with."""


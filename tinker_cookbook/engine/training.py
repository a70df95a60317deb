"""LoRA training on a shared, frozen base model.

``BaseModel`` holds one base model's weights once per process (roadmap: many adapters on one base). Each
training client is a ``TrainingSession``: a named peft adapter on that base, its AdamW state and its pending
gradients. Sessions never see each other's parameters: the engine runs one request at a time and activates the
request's adapter first.

Memory: a sequence's logprobs are computed from the final hidden states in token chunks, each chunk's loss
backpropagated to the hidden states before the next chunk's logits exist, so full-vocabulary fp32 logits (and
their gradients) never exist for more than one chunk at once.
Sequences of similar length run together as one right-padded batch, with padding bounded to a small fraction.
"""

from __future__ import annotations

import json
import math
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import safetensors.torch
import torch
from transformers import PreTrainedModel

from tinker_cookbook.engine import losses
from tinker_cookbook.engine.models import ModelSpec
from tinker_cookbook.engine.optimizer import AdamW
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, UnprocessableEntityError

LOGPROB_CHUNK_TOKENS = 256
GROUP_MAX_TOKENS = 2048
GROUP_MAX_PAD_FRACTION = 0.15
LORA_ALPHA = 32
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.safetensors"

TokenLoss = Callable[[torch.Tensor, slice], torch.Tensor]
"""A loss that is a sum of per-token terms: (logprobs of a span of tokens, that span) -> their loss."""
CustomLossFn = Callable[[list[types.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


class BaseModel:
    """One frozen base model shared by all adapters on it, plus clean references to its weights."""

    def __init__(self, spec: ModelSpec, model: PreTrainedModel) -> None:
        self.spec = spec
        self.config = model.config
        text_config = getattr(model.config, "text_config", None) or model.config
        self.vocab_size: int = int(text_config.vocab_size)
        self.is_vision = hasattr(model.config, "vision_config")
        # References (no copies) to the weights before peft wraps the modules; they never change.
        tied = bool(getattr(text_config, "tie_word_embeddings", False) or getattr(model.config, "tie_word_embeddings", False))
        self.base_state: dict[str, torch.Tensor] = {
            k: v.detach() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")
        }
        # peft records this as the adapter's base model (adapter_config.json); config-built models have none.
        model.config.name_or_path = spec.name
        model.__dict__["name_or_path"] = spec.name
        self._model = model
        self._peft_model: Any = None

    def add_adapter(self, name: str, lora: types.LoraConfig) -> None:
        import peft  # slow to import; only needed once a training client exists

        targets = [
            *(ATTN_MODULES if lora.train_attn else ()),
            *(MLP_MODULES if lora.train_mlp else ()),
            *(UNEMBED_MODULES if lora.train_unembed else ()),
        ]
        config = peft.LoraConfig(
            r=lora.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets, bias="none",
            base_model_name_or_path=self.spec.name,
        )
        seed = lora.seed if lora.seed is not None else random.SystemRandom().randrange(2**31)
        # peft initialises LoRA A from the global RNG: seed it locally so callers' RNG streams are untouched.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # With tied embeddings a LoRA on lm_head changes only the output projection, which is what
            # train_unembed means; the sampler gives lm_head its own weight when it merges. peft warns anyway.
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            torch.manual_seed(seed)
            if self._peft_model is None:
                self._peft_model = peft.get_peft_model(self._model, config, adapter_name=name)
            else:
                self._peft_model.add_adapter(name, config)
        for param in self._peft_model.parameters():
            param.requires_grad_(False)

    def remove_adapter(self, name: str) -> None:
        if self._peft_model is not None and name in self._peft_model.peft_config:
            self._peft_model.delete_adapter(name)

    def activate(self, name: str) -> Any:
        """Make ``name`` the adapter that forward passes use; returns the wrapped HF causal LM."""
        self._peft_model.base_model.set_adapter(name)
        return self._peft_model.base_model.model

    def adapter_params(self, name: str) -> dict[str, torch.nn.Parameter]:
        """The adapter's trainable tensors, keyed without the adapter name (so saved state loads into any name)."""
        marker = f".{name}."
        return {
            k.replace(marker, "."): p for k, p in self._peft_model.named_parameters() if marker in k and "lora_" in k
        }

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """The adapter's weights under PEFT's saved-format keys (copies)."""
        import peft

        state = peft.get_peft_model_state_dict(self._peft_model, adapter_name=name, save_embedding_layers=False)
        return {k: v.detach().clone().contiguous() for k, v in state.items()}

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        import peft

        expected = self.adapter_state(name)
        bad = [k for k in expected if k not in state or state[k].shape != expected[k].shape]
        extra = [k for k in state if k not in expected]
        if bad or extra:
            raise BadRequestError(
                f"checkpoint does not match this adapter ({len(bad)} missing/mis-shaped, {len(extra)} unexpected "
                f"tensors, e.g. {(bad + extra)[:2]}); load it into a client with the same base model, rank and "
                "train_attn/train_mlp/train_unembed, or use create_training_client_from_state"
            )
        with torch.no_grad():
            peft.set_peft_model_state_dict(self._peft_model, state, adapter_name=name)

    def adapter_config_dict(self, name: str) -> dict[str, Any]:
        config = self._peft_model.peft_config[name].to_dict()
        return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


@dataclass
class DatumTensors:
    input_ids: torch.Tensor
    inputs: dict[str, torch.Tensor]


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

    # -- validation -------------------------------------------------------------------------------------

    def _datum_tensors(self, index: int, datum: types.Datum, required: tuple[str, ...]) -> DatumTensors:
        where = f"data[{index}]"
        try:
            tokens = datum.model_input.to_ints()
        except ValueError as exc:
            raise UnprocessableEntityError(
                f"{where}.model_input holds image chunks; training on images is not supported by the local engine yet"
            ) from exc
        n = len(tokens)
        if n == 0:
            raise BadRequestError(f"{where}.model_input is empty; every datum needs at least one token")
        limit = self.base.spec.max_context_length
        if n > limit:
            raise BadRequestError(f"{where}.model_input has {n} tokens, more than the context window {limit} of "
                                  f"{self.base.spec.name}; truncate it (e.g. max_length in the dataset builder)")
        missing = [k for k in required if k not in datum.loss_fn_inputs]
        if missing:
            raise BadRequestError(f"{where}.loss_fn_inputs lacks {missing} (has {sorted(datum.loss_fn_inputs)})")
        inputs: dict[str, torch.Tensor] = {}
        for key in required:
            td = datum.loss_fn_inputs[key]
            tensor = td.to_torch()
            if tensor.dim() != 1 or tensor.shape[0] != n:
                raise BadRequestError(f"{where}.loss_fn_inputs[{key!r}] has shape {list(tensor.shape)} but "
                                      f"model_input has {n} tokens; each loss input must have shape [{n}]")
            if key == "target_tokens":
                if td.dtype != "int64":
                    raise BadRequestError(f"{where}.loss_fn_inputs['target_tokens'] has dtype {td.dtype}; use int64")
                bad = tensor[(tensor < 0) | (tensor >= self.base.vocab_size)]
                if bad.numel():
                    raise BadRequestError(f"{where}.loss_fn_inputs['target_tokens'] holds id {int(bad[0])} outside "
                                          f"the vocabulary [0, {self.base.vocab_size})")
            else:
                if td.dtype != "float32":
                    raise BadRequestError(f"{where}.loss_fn_inputs[{key!r}] has dtype {td.dtype}; use float32")
                if not torch.isfinite(tensor).all():
                    raise BadRequestError(f"{where}.loss_fn_inputs[{key!r}] holds NaN or inf; "
                                          "all loss inputs must be finite")
            inputs[key] = tensor
        token_tensor = torch.tensor(tokens, dtype=torch.int64)
        bad_in = token_tensor[(token_tensor < 0) | (token_tensor >= self.base.vocab_size)]
        if bad_in.numel():
            raise BadRequestError(f"{where}.model_input holds token id {int(bad_in[0])} outside the vocabulary "
                                  f"[0, {self.base.vocab_size})")
        return DatumTensors(token_tensor, inputs)

    def _validate(self, data: list[types.Datum], required: tuple[str, ...]) -> list[DatumTensors]:
        if not data:
            raise BadRequestError("data is empty; pass at least one Datum")
        return [self._datum_tensors(i, d, required) for i, d in enumerate(data)]

    # -- forward passes ---------------------------------------------------------------------------------

    def _run_group(self, model: Any, items: list[DatumTensors], token_losses: list[TokenLoss] | None
                   ) -> tuple[list[torch.Tensor], list[float]]:
        """Logprobs of each item's targets (and, with ``token_losses``, backpropagate them); one padded pass.

        Items are right-padded into one batch. Under causal attention a real token only sees earlier, real
        tokens, so padding at the end changes nothing for them and needs no attention mask. The head then runs
        row by row, chunk by chunk, on a detached copy of the hidden states: each chunk's logits live only while
        that chunk's loss is backpropagated into the hidden states, which finally flow through the decoder in one
        backward. Exact because every loss here is a sum of per-token terms; no logits are recomputed.
        """
        grad = token_losses is not None
        width = max(len(item.input_ids) for item in items)
        ids = torch.zeros(len(items), width, dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, : len(item.input_ids)] = item.input_ids
        with torch.set_grad_enabled(grad):
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        leaf = hidden.detach().requires_grad_(grad and hidden.requires_grad)
        head = model.get_output_embeddings()
        logps, totals = [], []
        for row, item in enumerate(items):
            targets, pieces, total = item.inputs["target_tokens"], [], 0.0
            for start in range(0, len(targets), LOGPROB_CHUNK_TOKENS):
                span = slice(start, min(start + LOGPROB_CHUNK_TOKENS, len(targets)))
                with torch.set_grad_enabled(grad):
                    logp = _chunk_logprobs(head, leaf[row, span], targets[span])
                    if token_losses is not None:
                        loss = token_losses[row](logp, span)
                        if loss.requires_grad:
                            loss.backward()
                        total += float(loss.detach())
                pieces.append(logp.detach())
            logps.append(torch.cat(pieces))
            totals.append(total)
        if grad and leaf.grad is not None:
            hidden.backward(leaf.grad)
        return logps, totals

    def _run_batch(self, model: Any, batch: list[DatumTensors], token_losses: list[TokenLoss] | None
                   ) -> tuple[list[torch.Tensor], list[float]]:
        """``_run_group`` over groups of similar-length items, results in the original order."""
        logps: list[torch.Tensor] = [torch.empty(0)] * len(batch)
        totals = [0.0] * len(batch)
        for group in _length_groups([len(item.input_ids) for item in batch]):
            group_losses = [token_losses[i] for i in group] if token_losses is not None else None
            group_logps, group_totals = self._run_group(model, [batch[i] for i in group], group_losses)
            for i, logp, total in zip(group, group_logps, group_totals):
                logps[i], totals[i] = logp, total
        return logps, totals

    def forward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None, backward: bool
    ) -> types.ForwardBackwardOutput:
        spec = losses.get_loss(loss_fn)
        config = losses.resolve_config(loss_fn, loss_fn_config)
        batch = self._validate(data, spec.required_inputs)
        model = self.base.activate(self.run_id)
        saved_grads = self._grads_snapshot() if backward else None
        try:
            if backward:
                def token_loss(item: DatumTensors) -> TokenLoss:
                    return lambda logp, span: spec.fn(logp, {k: v[span] for k, v in item.inputs.items()}, config)

                logps, totals = self._run_batch(model, batch, [token_loss(item) for item in batch])
            else:
                logps, _ = self._run_batch(model, batch, None)
                totals = [float(spec.fn(lp, item.inputs, config)) for lp, item in zip(logps, batch)]
        except BaseException:
            if saved_grads is not None:
                self._restore_grads(saved_grads)
            raise
        if backward:
            self.pending_backward += 1
        return types.ForwardBackwardOutput(
            loss_fn_output_type=loss_fn,
            loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(lp.float())} for lp in logps],
            metrics={"loss:sum": sum(totals)},
        )

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: CustomLossFn) -> types.ForwardBackwardOutput:
        """A user loss on per-datum logprobs, applied through the linear surrogate sum(dL/dlogp · logp).

        Pass 1 computes logprobs without a graph; the user's loss runs on leaf copies of them and autograd gives
        g = dL/dlogp; pass 2 backpropagates sum(g · logp). The gradient equals direct autograd of the loss while
        the graph of only one group of sequences is alive at a time.
        """
        batch = self._validate(data, ("target_tokens",))
        model = self.base.activate(self.run_id)
        logps, _ = self._run_batch(model, batch, None)
        leaves = [lp.clone().requires_grad_(True) for lp in logps]
        loss, metrics = loss_fn(data, leaves)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise BadRequestError(f"custom loss_fn must return (scalar tensor, metrics), got loss={loss!r}")
        coeffs = torch.autograd.grad(loss, leaves, allow_unused=True)
        saved_grads = self._grads_snapshot()
        try:
            zeros = [torch.zeros_like(lp) for lp in logps]
            weights = [(c if c is not None else z).detach() for c, z in zip(coeffs, zeros)]
            self._run_batch(model, batch, [lambda logp, span, g=g: (logp * g[span]).sum() for g in weights])
        except BaseException:
            self._restore_grads(saved_grads)
            raise
        self.pending_backward += 1
        outputs = [{"logprobs": types.TensorData.from_torch(lp.float())} for lp in logps]
        out_metrics = {"loss:sum": float(loss.detach()), **{k: float(v) for k, v in metrics.items()}}
        return types.ForwardBackwardOutput(loss_fn_output_type="custom", loss_fn_outputs=outputs, metrics=out_metrics)

    # -- gradients and optimizer ------------------------------------------------------------------------

    def _grads_snapshot(self) -> dict[str, torch.Tensor | None]:
        return {k: (p.grad.clone() if p.grad is not None else None) for k, p in self.params.items()}

    def _restore_grads(self, saved: dict[str, torch.Tensor | None]) -> None:
        for k, p in self.params.items():
            p.grad = saved[k]

    def optim_step(self, hp: types.AdamParams) -> types.OptimStepResponse:
        _validate_adam(hp)
        if self.pending_backward == 0:
            raise BadRequestError("optim_step called with no accumulated gradients; call forward_backward first")
        metrics = self.optimizer.step(hp)
        for p in self.params.values():
            p.grad = None
        self.pending_backward = 0
        return types.OptimStepResponse(metrics=metrics)

    # -- checkpoints ------------------------------------------------------------------------------------

    def write_adapter(self, directory: Path) -> None:
        safetensors.torch.save_file(self.base.adapter_state(self.run_id), str(directory / ADAPTER_WEIGHTS_FILE),
                                    metadata={"format": "pt"})
        config = self.base.adapter_config_dict(self.run_id)
        (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2))

    def write_state(self, directory: Path) -> None:
        self.write_adapter(directory)
        safetensors.torch.save_file(self.optimizer.state_tensors(), str(directory / OPTIMIZER_FILE))

    def load_state(self, directory: Path, with_optimizer: bool) -> None:
        state = safetensors.torch.load_file(str(directory / ADAPTER_WEIGHTS_FILE))
        if with_optimizer and not (directory / OPTIMIZER_FILE).exists():
            raise BadRequestError(f"{directory.name} has no optimizer state; it is a sampler checkpoint? use "
                                  "load_state (weights only) or a weights/ checkpoint from save_state")
        self.base.load_adapter_state(self.run_id, state)
        for p in self.params.values():
            p.grad = None
        self.pending_backward = 0
        if with_optimizer:
            self.optimizer.load_state_tensors(safetensors.torch.load_file(str(directory / OPTIMIZER_FILE)))
        else:
            self.optimizer = AdamW(self.params)

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


def _length_groups(lengths: list[int]) -> list[list[int]]:
    """Indices grouped for padded batches: similar lengths together, padding and size bounded.

    Many short sequences (RL rollouts) run far faster as one batch than one by one on a CPU, while mixing very
    different lengths would spend compute on padding; a group grows (in length order) while its padded size stays
    within GROUP_MAX_TOKENS and padding within GROUP_MAX_PAD_FRACTION of it.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        candidate = [*current, index]
        padded = lengths[index] * len(candidate)
        real = sum(lengths[i] for i in candidate)
        if current and (padded > GROUP_MAX_TOKENS or padded - real > GROUP_MAX_PAD_FRACTION * padded):
            groups.append(current)
            candidate = [index]
        current = candidate
    if current:
        groups.append(current)
    return groups


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _validate_adam(hp: types.AdamParams) -> None:
    checks = [
        ("learning_rate", hp.learning_rate, hp.learning_rate >= 0, ">= 0"),
        ("beta1", hp.beta1, 0 <= hp.beta1 < 1, "in [0, 1)"),
        ("beta2", hp.beta2, 0 <= hp.beta2 < 1, "in [0, 1)"),
        ("eps", hp.eps, hp.eps > 0, "> 0"),
        ("weight_decay", hp.weight_decay, hp.weight_decay >= 0, ">= 0"),
        ("grad_clip_norm", hp.grad_clip_norm, hp.grad_clip_norm >= 0, ">= 0 (0 disables clipping)"),
    ]
    for name, value, ok, rule in checks:
        if not ok or not math.isfinite(value):
            raise BadRequestError(f"AdamParams.{name}={value} is invalid; it must be finite and {rule}")

"""LoRA training on a shared, frozen base model.

``BaseModel`` holds one base model's weights once per process (roadmap: many adapters on one base). Each
training client is a ``TrainingSession``: a named peft adapter on that base, its AdamW state and its pending
gradients. Sessions never see each other's parameters: the engine runs one request at a time and activates the
request's adapter first, or runs built-in-loss requests of several sessions in one pass (``multi_client.forward_together``)
with each row routed through its own session's adapter (``multi_lora``).

Memory: a sequence's logprobs are computed from the final hidden states in token chunks, each chunk's loss
backpropagated to the hidden states before the next chunk's logits exist, so full-vocabulary fp32 logits (and
their gradients) never exist for more than one chunk at once.
Sequences of similar length run together as one right-padded batch, with padding bounded to a small fraction;
long rows of unequal lengths run packed end to end instead, without padding.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import numbers
import random
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from transformers import PreTrainedModel

from tinker_cookbook.engine import vision
from tinker_cookbook.engine.device import fast_fp32_matmuls
from tinker_cookbook.engine.models import ModelSpec
from tinker_cookbook.engine.training import frozen_linear, fused_layers, losses, multi_lora, passes
from tinker_cookbook.engine.training.optimizer import AdamW, InvalidState, NonFiniteStep
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, TinkerError, UnprocessableEntityError

LORA_ALPHA = 32
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
PACK_FP32_BASE = True
"""Whether the fp32 base's Linear layers also run on packed oneDNN weights on the CPU (bf16 ones always do).

Unpacked, fp32 matmuls already run oneDNN's kernels (``fast_fp32_matmuls``); packing W and Wᵀ once gained 8%
tokens/s on SmolLM2-135M for +0.84 GB peak RSS (see the README). Set False to trade that speed for memory."""
FUSED_LAYERS = True
"""Whether, on the CPU, the decoder's RMSNorms, SiLU MLPs, rotary embeddings and attention run as the hand-fused
autograd functions of ``fused_layers`` (same values to fp32 rounding, fewer sweeps over the activations, less saved
for the backward)."""
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.safetensors"



@dataclass(frozen=True)
class TokenLoss:
    """One datum's loss, a sum of per-token terms: ``fn(logprobs of a span of tokens, that span)`` -> their loss.

    ``reach`` (bool ``[n]``, or None for all): the positions where the gradient can be non-zero. The others'
    logprobs are computed without a graph, so the unembedding's backward (a vocabulary-wide matmul per position)
    skips them; the gradient is the same, because there it is exactly 0.
    """

    fn: Callable[[torch.Tensor, slice], torch.Tensor]
    reach: torch.Tensor | None = None
CustomLossFn = Callable[[list[types.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


class BaseModel:
    """One frozen base model shared by all adapters on it, plus clean references to its weights."""

    def __init__(self, spec: ModelSpec, model: PreTrainedModel, compute_dtype: torch.dtype = torch.float32) -> None:
        """``model``: fp32, on the engine's device. ``compute_dtype`` bf16 runs the frozen base's matmuls in bf16
        (on the CPU through bf16 weights packed once, see ``frozen_linear``; elsewhere autocast); LoRA parameters,
        gradients, the optimizer state and the logits stay fp32 either way."""
        self.spec = spec
        self.config = model.config
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        text_config = getattr(model.config, "text_config", None) or model.config
        self.vocab_size: int = int(text_config.vocab_size)
        self.is_vision = hasattr(model.config, "vision_config")
        self.image_inputs = vision.image_inputs_for(spec.name, spec.source, model.config)
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
        self.decoder_positions = 0
        """Token positions run through the decoder so far (padding and each shared prefix once included)."""
        # On the CPU the frozen Linear layers compute through packed weights (bf16: instead of autocast, which
        # re-casts every weight per call, forward and backward). In bf16 mode only their matmuls are bf16: the
        # activations between them, attention, LoRA and the unembedding (so the logits) stay fp32.
        self.packed_bytes = 0
        if self.device.type == "cpu" and (compute_dtype == torch.bfloat16 or PACK_FP32_BASE):
            skip = UNEMBED_MODULES if compute_dtype != torch.float32 else ()
            self.packed_bytes = frozen_linear.install(model, compute_dtype, skip=skip)
        if self.device.type == "cpu" and FUSED_LAYERS:
            fused_layers.install(model)
        self.packs_rows = (getattr(model.config, "_attn_implementation", None) == fused_layers.ATTENTION_NAME
                           and (compute_dtype == torch.float32 or self.packed_bytes > 0))
        """Whether training passes may pack long rows without padding (``passes.packable``): where the fused
        attention computes each packed row's attention on its own, which needs fp32 activations (not autocast).
        Elsewhere the packed mask would cost more than the padding saves."""

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

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision of the decoder's forward (its backward follows it): bf16 matmuls, or plain fp32."""
        if self.compute_dtype == torch.float32 or self.packed_bytes:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

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

    def check_adapter_state(self, name: str, state: dict[str, torch.Tensor], source: str) -> None:
        """Raise BadRequestError (naming ``source``) unless ``state`` has exactly the adapter's tensors, finite."""
        expected = self.adapter_state(name)
        bad = [k for k in expected if k not in state or state[k].shape != expected[k].shape]
        extra = [k for k in state if k not in expected]
        if bad or extra:
            raise BadRequestError(
                f"{source} does not match this adapter ({len(bad)} missing/mis-shaped, {len(extra)} unexpected "
                f"tensors, e.g. {(bad + extra)[:2]}); load it into a client with the same base model, rank and "
                "train_attn/train_mlp/train_unembed, or use create_training_client_from_state"
            )
        for key, tensor in state.items():
            if not tensor.dtype.is_floating_point or not bool(torch.isfinite(tensor).all()):
                raise BadRequestError(f"{source}: tensor {key!r} (dtype {tensor.dtype}) is not finite floating-point "
                                      "data; the checkpoint is damaged: load an earlier checkpoint or save it again")

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor], source: str = "adapter state") -> None:
        import peft

        self.check_adapter_state(name, state, source)
        with torch.no_grad():
            peft.set_peft_model_state_dict(self._peft_model, state, adapter_name=name)

    def adapter_config_dict(self, name: str) -> dict[str, Any]:
        config = self._peft_model.peft_config[name].to_dict()
        return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


@dataclass
class DatumTensors:
    input_ids: torch.Tensor
    inputs: dict[str, torch.Tensor]
    images: tuple[vision.PreparedImage, ...] = ()


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

    def output(self, logps: list[torch.Tensor], totals: list[float] | None) -> types.ForwardBackwardOutput:
        """The response; ``totals`` (the per-datum losses of a backward pass) or None: computed from the logprobs."""
        if totals is None:
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

    # -- validation -------------------------------------------------------------------------------------

    def _datum_tensors(self, index: int, datum: Any, required: tuple[str, ...]) -> DatumTensors:
        where = f"data[{index}]"
        if not isinstance(datum, types.Datum):
            hint = " (build it with types.Datum(**that_dict))" if isinstance(datum, dict) else ""
            raise BadRequestError(f"{where} is a {type(datum).__name__} ({_short(datum)}), not a types.Datum; pass a "
                                  f"list of types.Datum(model_input=..., loss_fn_inputs=...){hint}")
        if not isinstance(datum.model_input, types.ModelInput):
            raise BadRequestError(f"{where}.model_input is a {type(datum.model_input).__name__}, not a "
                                  "types.ModelInput; use types.ModelInput.from_ints(tokens)")
        tokens, images = vision.expand_model_input(datum.model_input, f"{where}.model_input", self.base.image_inputs,
                                                   self.base.spec.name)
        n = len(tokens)
        if n == 0:
            raise BadRequestError(f"{where}.model_input is empty; every datum needs at least one token")
        limit = self.base.spec.max_context_length
        if n > limit:
            raise BadRequestError(f"{where}.model_input has {n} tokens, more than the context window {limit} of "
                                  f"{self.base.spec.name}; truncate it (e.g. max_length in the dataset builder)")
        # Checked on the Python ints, before torch sees them: an id like 2**70 does not even fit in int64.
        bad_id = _first_outside(tokens, self.base.vocab_size)
        if bad_id is not None:
            raise BadRequestError(f"{where}.model_input holds token id {bad_id} outside the vocabulary "
                                  f"[0, {self.base.vocab_size}); encode the text with this model's tokenizer")
        if not isinstance(datum.loss_fn_inputs, dict):
            raise BadRequestError(f"{where}.loss_fn_inputs is a {type(datum.loss_fn_inputs).__name__}, not a dict "
                                  "of name -> TensorData")
        missing = [k for k in required if k not in datum.loss_fn_inputs]
        if missing:
            raise BadRequestError(f"{where}.loss_fn_inputs lacks {missing} (has {sorted(datum.loss_fn_inputs)})")
        # target_tokens first: its shape ([n], or [n, k] for k candidate tokens per position) is the shape of the
        # logprobs and of every other loss input.
        keys = sorted(required, key=lambda k: k != "target_tokens")
        inputs = {key: self._loss_input(f"{where}.loss_fn_inputs[{key!r}]", key, datum.loss_fn_inputs[key], n)
                  for key in keys}
        shape = inputs["target_tokens"].shape if "target_tokens" in inputs else None
        if shape is not None and any(v.shape != shape for v in inputs.values()):
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
            raise BadRequestError(f"{where} has loss inputs of different shapes (model_input has {n} tokens; {shapes}); "
                                  f"every loss input must have the shape of target_tokens, {list(shape)}")
        device = self.base.device
        return DatumTensors(
            torch.tensor(tokens, dtype=torch.int64, device=device), {k: v.to(device) for k, v in inputs.items()},
            images,
        )

    def _loss_input(self, where: str, key: str, td: Any, n: int) -> torch.Tensor:
        """One loss input as a checked tensor of shape ``[n]`` (or ``[n, k]``: k candidate tokens per position)."""
        if not isinstance(td, types.TensorData):
            raise BadRequestError(f"{where} is a {type(td).__name__}, not a types.TensorData; pass a list, a numpy "
                                  "array or a torch tensor when building the Datum")
        if key == "target_tokens":
            if td.dtype != "int64":
                raise BadRequestError(f"{where} has dtype {td.dtype}; use int64")
            bad_id = _first_outside(td.data, self.base.vocab_size)
            if bad_id is not None:
                raise BadRequestError(f"{where} holds id {bad_id} outside the vocabulary [0, {self.base.vocab_size}); "
                                      "use token ids of this model's tokenizer")
        elif td.dtype != "float32":
            raise BadRequestError(f"{where} has dtype {td.dtype}; use float32")
        try:
            tensor = td.to_torch()
        except (ValueError, TypeError, OverflowError) as exc:  # data that does not fit its dtype or shape
            raise BadRequestError(f"{where} cannot be read as a {td.dtype} tensor of shape {td.shape} "
                                  f"({type(exc).__name__}: {exc}); give {n} plain numbers") from exc
        if tensor.dim() not in (1, 2) or tensor.shape[0] != n or tensor.numel() == 0:
            raise BadRequestError(f"{where} has shape {list(tensor.shape)} but model_input has {n} tokens; each "
                                  f"loss input must have shape [{n}] (or [{n}, k] with k >= 1 candidate tokens "
                                  "per position, like target_tokens)")
        if key != "target_tokens" and not bool(torch.isfinite(tensor).all()):
            raise BadRequestError(f"{where} holds NaN or inf (or a value beyond the float32 range); all loss inputs "
                                  "must be finite")
        return tensor

    def _validate(self, data: Any, required: tuple[str, ...]) -> list[DatumTensors]:
        if not isinstance(data, (list, tuple)):
            hint = "; wrap a single datum in a list: [datum]" if isinstance(data, types.Datum) else ""
            raise BadRequestError(f"data is a {type(data).__name__} ({_short(data)}), not a list of types.Datum{hint}")
        if not data:
            raise BadRequestError("data is empty; pass at least one Datum")
        return [self._datum_tensors(i, d, required) for i, d in enumerate(data)]

    # -- forward passes ---------------------------------------------------------------------------------

    def _run_group(self, model: Any, items: list[DatumTensors], token_losses: list[TokenLoss] | None,
                   row_adapters: list[str] | None = None) -> tuple[list[torch.Tensor], list[float]]:
        """Logprobs of each item's targets (and, with ``token_losses``, backpropagate them); one pass.

        Items are right-padded into one batch. Under causal attention a real token only sees earlier, real
        tokens, so padding at the end changes nothing for them and needs no attention mask. Long rows of unequal
        lengths run packed end to end instead, without padding (``passes.packable``). The head then runs
        row by row, chunk by chunk, on a detached copy of the hidden states: each chunk's logits live only while
        that chunk's loss is backpropagated into the hidden states, which finally flow through the decoder in one
        backward. Exact because every loss here is a sum of per-token terms; no logits are recomputed.

        ``row_adapters`` (a mixed pass, inside ``multi_lora.no_active_adapter``): the adapter of each row, equal
        names contiguous; rows then use their own adapter, in the decoder and in the head. None: the active one.
        """
        grad = token_losses is not None
        width = max(len(item.input_ids) for item in items)
        ids = torch.zeros(len(items), width, dtype=torch.long, device=self.base.device)
        for row, item in enumerate(items):
            ids[row, : len(item.input_ids)] = item.input_ids
        images = [image for item in items for image in item.images]
        lengths = [len(item.input_ids) for item in items]
        shared, packed = 0, False
        with torch.set_grad_enabled(grad), self.base.autocast():
            if images:
                hidden = vision.language_hidden(model, ids, images)
            elif row_adapters is not None:
                with multi_lora.row_segments(lora_layers(self.base), _segments(row_adapters)):
                    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            else:
                shared = 0 if self.base.is_vision else passes.shared_prefix_length([item.input_ids.tolist() for item in items])
                packed = shared == 0 and self.base.packs_rows and passes.packable(lengths)
                hidden = (passes.packed_hidden(model, [item.input_ids.to(ids.device) for item in items]) if packed
                          else passes.decoder_hidden(model, ids, shared))
        self.base.decoder_positions += sum(lengths) if packed else ids.numel() - (len(items) - 1) * shared
        # The unembedding and log-softmax run in fp32 outside autocast: logprobs are what the losses and RL's
        # importance ratios compare, so they get full precision whatever the decoder's.
        leaf = hidden.detach().float().requires_grad_(grad and hidden.requires_grad)
        head = model.get_output_embeddings()
        chunk = passes.logprob_chunk_tokens(head.weight.shape[0], leaf.device)
        logps, totals = [], []
        starts = [0, *itertools.accumulate(lengths)]
        for row, item in enumerate(items):
            row_hidden = leaf[0, starts[row]:starts[row] + lengths[row]] if packed else leaf[row]
            targets, pieces, total = item.inputs["target_tokens"], [], 0.0
            row_head = head if row_adapters is None else multi_lora.with_adapter(head, row_adapters[row])
            for start in range(0, len(targets), chunk):
                span = slice(start, min(start + chunk, len(targets)))
                with torch.set_grad_enabled(grad):
                    if token_losses is None:
                        logp = passes.chunk_logprobs(row_head, row_hidden[span], targets[span])
                    else:
                        reach = token_losses[row].reach
                        logp = passes.reached_logprobs(row_head, row_hidden[span], targets[span],
                                                 None if reach is None else reach[span])
                        loss = token_losses[row].fn(logp, span)
                        if loss.requires_grad:
                            loss.backward()
                        total += float(loss.detach())
                pieces.append(logp.detach())
            logps.append(torch.cat(pieces))
            totals.append(total)
        if grad and leaf.grad is not None:
            hidden.backward(leaf.grad.to(hidden.dtype))
        return logps, totals

    def _run_batch(self, model: Any, batch: list[DatumTensors], token_losses: list[TokenLoss] | None
                   ) -> tuple[list[torch.Tensor], list[float]]:
        """``_run_group`` over groups of similar-length items, results in the original order."""
        logps: list[torch.Tensor] = [torch.empty(0)] * len(batch)
        totals = [0.0] * len(batch)
        # The adapter's deltas through multi_lora's fused add where it reproduces peft (text rows, plain LoRA).
        layers = lora_layers(self.base)
        fused = not any(item.images for item in batch) and multi_lora.supports(layers, [self.run_id])
        with multi_lora.one_adapter(layers, self.run_id, self.params) if fused else contextlib.nullcontext():
            lengths = [len(item.input_ids) for item in batch]
            for group in passes.largest_first(passes.length_groups(lengths), lengths):
                group_losses = [token_losses[i] for i in group] if token_losses is not None else None
                with fast_fp32_matmuls(self.base.device):
                    group_logps, group_totals = self._run_group(model, [batch[i] for i in group], group_losses)
                for i, logp, total in zip(group, group_logps, group_totals, strict=True):
                    logps[i], totals[i] = logp, total
        return logps, totals

    def forward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None, backward: bool
    ) -> types.ForwardBackwardOutput:
        return self._run_prepared(self._prepare_forward(ForwardRequest(data, loss_fn, loss_fn_config, backward)))

    def _prepare_forward(self, request: ForwardRequest) -> PreparedForward:
        """Everything about a built-in-loss request that can be refused before the model runs."""
        spec = losses.get_loss(request.loss_fn)
        config = losses.resolve_config(request.loss_fn, request.loss_fn_config)
        batch = self._validate(request.data, spec.required_inputs)
        return PreparedForward(self, request, spec, config, batch)

    def _run_prepared(self, prepared: PreparedForward) -> types.ForwardBackwardOutput:
        """One built-in-loss request on its own: the session's adapter active on every row."""
        model = self.base.activate(self.run_id)
        if prepared.request.backward:
            with self._all_or_nothing():
                logps, totals = self._run_batch(model, prepared.batch, prepared.token_losses())
                check_losses_finite(totals)
                self._check_grads_finite("forward_backward")
            self.pending_backward += 1
            return prepared.output(logps, totals)
        logps, _ = self._run_batch(model, prepared.batch, None)
        return prepared.output(logps, None)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: CustomLossFn) -> types.ForwardBackwardOutput:
        """A user loss on per-datum logprobs, applied through the linear surrogate sum(dL/dlogp · logp).

        Pass 1 computes logprobs without a graph; the user's loss runs on leaf copies of them and autograd gives
        g = dL/dlogp; pass 2 backpropagates sum(g · logp). The gradient equals direct autograd of the loss while
        the graph of only one group of sequences is alive at a time. Everything the user's function returns is
        checked before pass 2, so a rejected loss accumulates nothing.
        """
        if not callable(loss_fn):
            raise BadRequestError(f"loss_fn={_short(loss_fn)} is not callable; pass a function "
                                  "(data, logprobs) -> (scalar loss tensor, metrics dict of floats)")
        batch = self._validate(data, ("target_tokens",))
        model = self.base.activate(self.run_id)
        logps, _ = self._run_batch(model, batch, None)
        # The user's function sees CPU tensors whatever the engine's device (it may mix in its own tensors).
        logps = [lp.cpu() for lp in logps]
        loss, metrics, weights = _run_custom_loss(loss_fn, list(data), logps)
        with self._all_or_nothing():
            self._run_batch(model, batch, [_surrogate(g.to(self.base.device)) for g in weights])
            self._check_grads_finite("forward_backward_custom")
        self.pending_backward += 1
        outputs = [{"logprobs": types.TensorData.from_torch(lp.float())} for lp in logps]
        return types.ForwardBackwardOutput(loss_fn_output_type="custom", loss_fn_outputs=outputs,
                                           metrics={"loss:sum": loss, **metrics})

    # -- gradients and optimizer ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Restore the pending gradients if the block fails: a rejected request accumulates nothing."""
        saved = self._saved_grads()
        try:
            yield
        except BaseException:
            self._restore_grads(saved)
            raise

    def _saved_grads(self) -> dict[str, torch.Tensor | None]:
        return {k: (p.grad.clone() if p.grad is not None else None) for k, p in self.params.items()}

    def _restore_grads(self, saved: dict[str, torch.Tensor | None]) -> None:
        for k, p in self.params.items():
            p.grad = saved[k]

    def _check_grads_finite(self, request: str) -> None:
        """Refuse gradients (this request's plus those accumulated before it) that hold NaN or inf."""
        bad = [k for k, p in self.params.items() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        if bad:
            raise UnprocessableEntityError(
                f"{request} refused: the gradients (added to those accumulated since the last optim_step) hold NaN "
                f"or inf in {len(bad)} tensors, e.g. {bad[0]}; nothing was accumulated. Make the loss smaller "
                "(scale weights/advantages down) or call optim_step between large batches"
            )

    def _clear_grads(self) -> None:
        for p in self.params.values():
            p.grad = None
        self.pending_backward = 0

    def optim_step(self, hp: types.AdamParams) -> types.OptimStepResponse:
        _validate_adam(hp)
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
        state = {k: v.cpu() for k, v in self.base.adapter_state(self.run_id).items()}
        safetensors.torch.save_file(state, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
        config = self.base.adapter_config_dict(self.run_id)
        (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2))

    def write_state(self, directory: Path) -> None:
        self.write_adapter(directory)
        optimizer = {k: v.cpu() for k, v in self.optimizer.state_tensors().items()}
        safetensors.torch.save_file(optimizer, str(directory / OPTIMIZER_FILE))

    def load_state(self, directory: Path, with_optimizer: bool, source: str) -> None:
        """Adopt a ``weights/`` checkpoint (``source``: its tinker:// path, for messages).

        Every file is read and checked (keys, shapes, dtypes, finite values) before anything changes, so a damaged
        checkpoint leaves the session exactly as it was.
        """
        adapter_label = f"{source}/{ADAPTER_WEIGHTS_FILE}"
        adapter = read_tensors(directory / ADAPTER_WEIGHTS_FILE, adapter_label)
        self.base.check_adapter_state(self.run_id, adapter, adapter_label)
        optimizer = AdamW(self.params)
        if with_optimizer:
            label = f"{source}/{OPTIMIZER_FILE}"
            if not (directory / OPTIMIZER_FILE).exists():
                raise BadRequestError(f"{label} is missing, so this checkpoint has no Adam state; load its weights "
                                      "only with load_state, or resume from a checkpoint written by save_state")
            try:
                optimizer.load_state_tensors(read_tensors(directory / OPTIMIZER_FILE, label))
            except InvalidState as exc:
                raise BadRequestError(f"{label} does not fit this adapter: {exc}; load an earlier checkpoint, or "
                                      "its weights only with load_state") from None
        self.base.load_adapter_state(self.run_id, adapter, adapter_label)
        self._clear_grads()
        self.optimizer = optimizer

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


def lora_layers(base: BaseModel) -> list[Any]:
    return multi_lora.lora_layers(base._peft_model)


def _segments(row_adapters: list[str]) -> list[tuple[str, int]]:
    """Runs of equal names: [a, a, b] -> [(a, 2), (b, 1)]."""
    segments: list[tuple[str, int]] = []
    for name in row_adapters:
        if segments and segments[-1][0] == name:
            segments[-1] = (name, segments[-1][1] + 1)
        else:
            segments.append((name, 1))
    return segments


def _surrogate(coeffs: torch.Tensor) -> TokenLoss:
    """The token loss sum(coeffs · logp), whose gradient is the custom loss's (``coeffs`` = dloss/dlogp)."""
    reach = (coeffs != 0).any(dim=-1) if coeffs.dim() == 2 else coeffs != 0
    return TokenLoss(lambda logp, span: (logp * coeffs[span]).sum(), reach)


def _first_outside(ids: Iterable[Any], vocab_size: int) -> Any:
    """The first id that is not a number in [0, vocab_size), or None (Python ints, so that any size compares)."""
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < vocab_size:
            return t
    return None


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validate_adam(hp: Any) -> None:
    if not isinstance(hp, types.AdamParams):
        hint = " (a dict converts with types.AdamParams(**d))" if isinstance(hp, dict) else ""
        raise BadRequestError(f"adam_params={_short(hp)} is a {type(hp).__name__}, not a types.AdamParams; pass e.g. "
                              f"types.AdamParams(learning_rate=1e-4){hint}")
    checks = [
        ("learning_rate", hp.learning_rate, lambda x: x >= 0, ">= 0"),
        ("beta1", hp.beta1, lambda x: 0 <= x < 1, "in [0, 1)"),
        ("beta2", hp.beta2, lambda x: 0 <= x < 1, "in [0, 1)"),
        ("eps", hp.eps, lambda x: x > 0, "> 0"),
        ("weight_decay", hp.weight_decay, lambda x: x >= 0, ">= 0"),
        ("grad_clip_norm", hp.grad_clip_norm, lambda x: x >= 0, ">= 0 (0 disables clipping)"),
    ]
    for name, value, ok, rule in checks:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
            raise BadRequestError(f"AdamParams.{name}={value!r} is invalid; it must be a finite number {rule}")


def check_losses_finite(totals: list[float]) -> None:
    bad = [i for i, total in enumerate(totals) if not math.isfinite(total)]
    if bad:
        raise UnprocessableEntityError(
            f"forward_backward refused: the loss of data[{bad[0]}] is {totals[bad[0]]} ({len(bad)} of {len(totals)} "
            "data overflow float32); nothing was accumulated. Scale its weights/advantages down"
        )


def _run_custom_loss(loss_fn: CustomLossFn, data: list[types.Datum], logps: list[torch.Tensor]
                     ) -> tuple[float, dict[str, float], list[torch.Tensor]]:
    """Run the user's loss on leaf copies of ``logps``: (loss, metrics, dloss/dlogp per datum), all checked."""
    leaves = [lp.clone().requires_grad_(True) for lp in logps]
    try:
        result = loss_fn(data, leaves)
    except TinkerError:
        raise
    except Exception as exc:  # the user's code failed, not the engine
        raise BadRequestError(f"the custom loss_fn raised {type(exc).__name__}: {exc}; fix the loss function (it "
                              "gets the data and one logprob tensor per datum)") from exc
    if not isinstance(result, tuple) or len(result) != 2:
        raise BadRequestError(f"custom loss_fn must return (scalar loss tensor, metrics dict), got {_short(result)}")
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.dtype.is_floating_point:
        raise BadRequestError(f"custom loss_fn must return (scalar tensor, metrics), got loss={_short(loss)}")
    value = float(loss.detach())
    if not math.isfinite(value):
        raise UnprocessableEntityError(f"forward_backward_custom refused: the custom loss is {value}; nothing was "
                                       "accumulated. Make the loss finite (e.g. guard logs and divisions)")
    checked = _custom_metrics(metrics)
    coeffs: tuple[torch.Tensor | None, ...] = (None,) * len(leaves)
    if loss.requires_grad:  # a loss that does not depend on the logprobs has zero gradient
        try:
            coeffs = torch.autograd.grad(loss, leaves, allow_unused=True)
        except RuntimeError as exc:
            raise BadRequestError(f"the gradient of the custom loss could not be computed ({exc}); build the loss "
                                  "from the given logprob tensors without in-place changes to them") from exc
    weights = [(c if c is not None else torch.zeros_like(lp)).detach() for c, lp in zip(coeffs, logps, strict=True)]
    bad = [i for i, w in enumerate(weights) if not bool(torch.isfinite(w).all())]
    if bad:
        raise UnprocessableEntityError(f"forward_backward_custom refused: the gradient of the custom loss with respect "
                                       f"to logprobs[{bad[0]}] holds NaN or inf; nothing was accumulated. Make the "
                                       "loss smooth where it is evaluated (e.g. no sqrt or log at 0)")
    return value, checked, weights


def _custom_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, dict):
        raise BadRequestError(f"custom loss_fn must return (loss, metrics) with metrics a dict of str -> float, got "
                              f"metrics={_short(metrics)}")
    checked: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise BadRequestError(f"custom loss_fn metrics[{key!r}]={_short(value)} is not a float; return plain "
                                  "floats keyed by name, e.g. {'kl': float(kl.detach())}")
        checked[key] = float(value)
    return checked


def read_tensors(path: Path, label: str) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file; missing, truncated or corrupt is a BadRequestError naming ``label``."""
    if not path.is_file():
        raise BadRequestError(f"{label} is missing; the checkpoint is incomplete: load an earlier one or save again")
    try:
        return safetensors.torch.load_file(str(path))
    except safetensors.SafetensorError as exc:  # its messages name no file
        raise BadRequestError(f"{label} is not a readable safetensors file ({exc}); the checkpoint is damaged: load "
                              "an earlier one or save again") from exc


def read_json(path: Path, label: str) -> dict[str, Any]:
    """A checkpoint's JSON object file; missing or corrupt is a BadRequestError naming ``label``."""
    if not path.is_file():
        raise BadRequestError(f"{label} is missing; the checkpoint is incomplete: load an earlier one or save again")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"{label} is not valid JSON ({exc}); the checkpoint is damaged: load an earlier one "
                              "or save again") from exc
    if not isinstance(value, dict):
        raise BadRequestError(f"{label} holds a {type(value).__name__}, not a JSON object; the checkpoint is damaged")
    return value


def read_sampler_adapter(directory: Path, source: str, base: BaseModel
                         ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The PEFT adapter of a ``sampler_weights/`` checkpoint, checked against ``base`` before the sampler merges it.

    Checks what a damaged file could get wrong: readable files, finite floating-point tensors, LoRA pairs of the
    configured rank whose outer dimensions match the base weight they adapt.
    """
    weights_label, config_label = f"{source}/{ADAPTER_WEIGHTS_FILE}", f"{source}/{ADAPTER_CONFIG_FILE}"
    state = read_tensors(directory / ADAPTER_WEIGHTS_FILE, weights_label)
    config = read_json(directory / ADAPTER_CONFIG_FILE, config_label)
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise BadRequestError(f"{config_label} has r={rank!r}; the LoRA rank must be a positive integer")
    embed = next((v for k, v in base.base_state.items() if k.endswith("embed_tokens.weight")), None)
    for key, tensor in state.items():
        if not tensor.dtype.is_floating_point or not bool(torch.isfinite(tensor).all()):
            raise BadRequestError(f"{weights_label}: tensor {key!r} (dtype {tensor.dtype}) is not finite "
                                  "floating-point data; the checkpoint is damaged: load an earlier one or save again")
        for part, rank_dim in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if not key.endswith(part):
                continue
            module = key.removesuffix(part).removeprefix("base_model.model.")
            target = base.base_state.get(f"{module}.weight", embed if module == "lm_head" else None)
            outer = 1 - rank_dim  # A is [rank, in] and B is [out, rank], for a base weight of [out, in]
            if tensor.dim() != 2 or tensor.shape[rank_dim] != rank or (
                    target is not None and tensor.shape[outer] != target.shape[outer]):
                raise BadRequestError(f"{weights_label}: tensor {key!r} has shape {list(tensor.shape)}, which does not "
                                      f"fit rank {rank} on {base.spec.name}; the checkpoint is damaged or for another "
                                      "model")
    return state, config

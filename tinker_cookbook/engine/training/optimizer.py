"""AdamW over a LoRA adapter's parameters, with hyperparameters given per step.

Tinker takes the Adam hyperparameters with every ``optim_step`` (so schedules live in the client), which
``torch.optim.AdamW``'s fixed param groups model awkwardly; the update itself is a few lines, and keeping the
state as plain named tensors makes it trivial to save as safetensors and restore bit-exactly.
"""

from __future__ import annotations

import math

import torch

from tinker_cookbook.tinker import types


class NonFiniteStep(Exception):
    """A step would write NaN or inf into the weights or the Adam moments; nothing was changed."""


class InvalidState(Exception):
    """Saved optimizer tensors that do not fit this adapter (what is wrong is the message)."""


class AdamW:
    """Decoupled-weight-decay Adam (Loshchilov & Hutter) with optional global-norm gradient clipping.

    A step is all or nothing: the new moments and weights are computed aside and committed only if every value is
    finite, so one bad batch can never poison the adapter or its Adam state for the rest of the run.
    """

    def __init__(self, params: dict[str, torch.nn.Parameter]) -> None:
        self.params = params
        self.step_count = 0
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}

    @torch.no_grad()
    def step(self, hp: types.AdamParams) -> dict[str, float]:
        """One update from the parameters' ``.grad``; raises ``NonFiniteStep`` (changing nothing) on NaN/inf."""
        pending = {k: p.grad for k, p in self.params.items() if p.grad is not None}
        names, grads = list(pending), [g for g in pending.values() if g is not None]
        bad = [k for k, g in zip(names, grads, strict=True) if not bool(torch.isfinite(g).all())]
        if bad:
            raise NonFiniteStep(f"the accumulated gradients hold NaN or inf in {len(bad)} of {len(names)} tensors "
                                f"(e.g. {bad[0]})")
        # float64 so that large but finite gradients do not overflow the norm (and the clipping based on it).
        norms = [torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]
        grad_norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
        clip_coef = 1.0
        if hp.grad_clip_norm > 0 and grad_norm > hp.grad_clip_norm:
            clip_coef = hp.grad_clip_norm / (grad_norm + 1e-6)
        t = self.step_count + 1
        bias1 = 1.0 - hp.beta1**t
        bias2 = 1.0 - hp.beta2**t
        step_size = hp.learning_rate / bias1
        update_sq = 0.0
        staged: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for name, grad in zip(names, grads, strict=True):
            param = self.params[name]
            if clip_coef != 1.0:
                grad = grad * clip_coef
            m = self.exp_avg[name].clone().mul_(hp.beta1).add_(grad, alpha=1.0 - hp.beta1)
            v = self.exp_avg_sq[name].clone().mul_(hp.beta2).addcmul_(grad, grad, value=1.0 - hp.beta2)
            denom = (v / bias2).sqrt_().add_(hp.eps)
            new = param.detach().clone()
            if hp.weight_decay:
                new.mul_(1.0 - hp.learning_rate * hp.weight_decay)
            new.addcdiv_(m, denom, value=-step_size)
            if not all(bool(torch.isfinite(x).all()) for x in (m, v, new)):
                raise NonFiniteStep(f"the update of {name} overflows to NaN or inf (gradient norm {grad_norm:.3g}); "
                                    "set AdamParams.grad_clip_norm or make the loss smaller")
            update_sq += float((new - param).double().pow(2).sum())
            staged.append((name, m, v, new))
        for name, m, v, new in staged:
            self.exp_avg[name].copy_(m)
            self.exp_avg_sq[name].copy_(v)
            self.params[name].copy_(new)
        self.step_count = t
        return {
            "grad_norm": grad_norm,
            "update_norm": math.sqrt(update_sq),
            "learning_rate": hp.learning_rate,
            "step": float(t),
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The optimizer state as named tensors (for safetensors)."""
        state: dict[str, torch.Tensor] = {"step": torch.tensor([self.step_count], dtype=torch.int64)}
        for k in self.params:
            state[f"exp_avg.{k}"] = self.exp_avg[k].detach().clone()
            state[f"exp_avg_sq.{k}"] = self.exp_avg_sq[k].detach().clone()
        return state

    def load_state_tensors(self, state: dict[str, torch.Tensor]) -> None:
        """Adopt saved state; raises ``InvalidState`` (changing nothing) unless every tensor fits and is finite."""
        _check_state(self.params, state)
        self.step_count = int(state["step"].item())
        for k in self.params:
            self.exp_avg[k].copy_(state[f"exp_avg.{k}"])
            self.exp_avg_sq[k].copy_(state[f"exp_avg_sq.{k}"])


def _check_state(params: dict[str, torch.nn.Parameter], state: dict[str, torch.Tensor]) -> None:
    expected = {"step", *(f"exp_avg.{k}" for k in params), *(f"exp_avg_sq.{k}" for k in params)}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise InvalidState(f"its tensors do not match this adapter ({len(missing)} missing, e.g. {missing[:2]}; "
                           f"{len(extra)} unexpected, e.g. {extra[:2]})")
    step = state["step"]
    if step.dtype.is_floating_point or step.numel() != 1 or int(step.item()) < 0:
        raise InvalidState(f"'step' must be one non-negative integer, got dtype {step.dtype} shape {list(step.shape)}")
    for k, p in params.items():
        for key in (f"exp_avg.{k}", f"exp_avg_sq.{k}"):
            tensor = state[key]
            if tensor.shape != p.shape or tensor.dtype != p.dtype:
                raise InvalidState(f"{key!r} has shape {list(tensor.shape)} and dtype {tensor.dtype}; this adapter "
                                   f"needs shape {list(p.shape)} and dtype {p.dtype}")
            if not bool(torch.isfinite(tensor).all()):
                raise InvalidState(f"{key!r} holds NaN or inf")
            if key.startswith("exp_avg_sq.") and bool((tensor < 0).any()):
                raise InvalidState(f"{key!r} holds negative values (a second moment is never negative)")

"""AdamW over a LoRA adapter's parameters, with hyperparameters given per step.

Tinker takes the Adam hyperparameters with every ``optim_step`` (so schedules live in the client), which
``torch.optim.AdamW``'s fixed param groups model awkwardly; the update itself is a few lines, and keeping the
state as plain named tensors makes it trivial to save as safetensors and restore bit-exactly.
"""

from __future__ import annotations

import math

import torch

from tinker_cookbook.tinker import types


class AdamW:
    """Decoupled-weight-decay Adam (Loshchilov & Hutter) with optional global-norm gradient clipping."""

    def __init__(self, params: dict[str, torch.nn.Parameter]) -> None:
        self.params = params
        self.step_count = 0
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}

    @torch.no_grad()
    def step(self, hp: types.AdamParams) -> dict[str, float]:
        names = [k for k, p in self.params.items() if p.grad is not None]
        grads = [self.params[k].grad for k in names]
        grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
        clip_coef = 1.0
        if hp.grad_clip_norm > 0 and grad_norm > hp.grad_clip_norm:
            clip_coef = hp.grad_clip_norm / (grad_norm + 1e-6)
        self.step_count += 1
        t = self.step_count
        bias1 = 1.0 - hp.beta1**t
        bias2 = 1.0 - hp.beta2**t
        step_size = hp.learning_rate / bias1
        update_sq = 0.0
        for name, grad in zip(names, grads):
            param = self.params[name]
            if clip_coef != 1.0:
                grad = grad * clip_coef
            m, v = self.exp_avg[name], self.exp_avg_sq[name]
            m.mul_(hp.beta1).add_(grad, alpha=1.0 - hp.beta1)
            v.mul_(hp.beta2).addcmul_(grad, grad, value=1.0 - hp.beta2)
            denom = (v / bias2).sqrt_().add_(hp.eps)
            before = param.detach().clone()
            if hp.weight_decay:
                param.mul_(1.0 - hp.learning_rate * hp.weight_decay)
            param.addcdiv_(m, denom, value=-step_size)
            update_sq += float((param - before).pow(2).sum())
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
        missing = [k for k in self.params if f"exp_avg.{k}" not in state]
        if missing:
            raise KeyError(f"optimizer state lacks {len(missing)} parameters, e.g. {missing[:3]}")
        self.step_count = int(state["step"].item())
        for k in self.params:
            self.exp_avg[k].copy_(state[f"exp_avg.{k}"])
            self.exp_avg_sq[k].copy_(state[f"exp_avg_sq.{k}"])

"""On-policy distillation over the shared RL loop (``tinker_cookbook.rl.train``).

The student samples replies to prompts (``datasets``); the teacher scores each sampled token with
``compute_logprobs`` (one request per datum, all in flight at once); each sampled token t then gets

    advantage_t += −coef · (log p_student(x_t) − log p_teacher(x_t))

(optionally summed over the later tokens of the reply with discount γ: ``A_t = Σ_{k≥t} γ^(k−t) a_k``), so the
policy-gradient step lowers the per-token reverse KL(student ‖ teacher) on the student's own samples. The envs give
no reward, so the teacher's term is the whole signal (with rewarding envs it adds to their centred rewards).

This is an ``AdvantageShaper`` of the RL loop: set ``rl.train.Config(advantage_shaper=TeacherKLShaperBuilder(...),
dataset_builder=CompositeDatasetBuilder(...))``; each group's teacher is the one its dataset carries
(``datasets.TeacherGroupBuilder``). Logged: ``teacher_kl`` (the mean per-token log p_student − log p_teacher of
the batch's sampled tokens, a sample estimate of the reverse KL) and ``teacher_kl/dataset_<k>`` per dataset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import chz
import numpy as np

from tinker_cookbook import tinker
from tinker_cookbook.distillation.datasets import TeacherConfig, TeacherGroupBuilder
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl.data_processing import DatumSource
from tinker_cookbook.rl.metrics import discounted_future_sum
from tinker_cookbook.rl.train_step import AdvantageShaper, AdvantageShaperBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder


def teacher_kl_advantages(sampled_logprobs_T: np.ndarray, teacher_logprobs_T: np.ndarray, mask_T: np.ndarray,
                          kl_penalty_coef: float, kl_discount_factor: float) -> tuple[np.ndarray, np.ndarray]:
    """(the advantage term, the per-token reverse KL) of one datum; both 0 where ``mask`` is 0.

    reverse_kl_t = mask_t · (sampled_t − teacher_t); term_t = −coef · reverse_kl_t, then with γ > 0 summed over the
    later tokens (``A_t = Σ_{k≥t} γ^(k−t) term_k``) and masked again, so prompt tokens keep advantage 0.
    """
    mask = mask_T.astype(np.float64)
    reverse_kl = (sampled_logprobs_T.astype(np.float64) - teacher_logprobs_T.astype(np.float64)) * mask
    term = -kl_penalty_coef * reverse_kl
    if kl_discount_factor > 0:
        term = discounted_future_sum(term, kl_discount_factor) * mask
    return term, reverse_kl


async def teacher_logprobs(data_D: Sequence[tinker.Datum], clients_D: Sequence[tinker.SamplingClient]
                           ) -> list[np.ndarray]:
    """Each datum's teacher logprob of each of its target tokens; all requests are sent at once (the sampler
    batches them)."""

    async def one(datum: tinker.Datum, client: tinker.SamplingClient) -> np.ndarray:
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        full = datum.model_input.append_int(int(targets[-1]))
        logprobs = await client.compute_logprobs_async(full)
        # Entry k scores full[k] given full[:k]; the targets are full[1:], so the leading None is dropped.
        return np.asarray(logprobs[1:], dtype=np.float64)

    return list(await asyncio.gather(*(one(d, c) for d, c in zip(data_D, clients_D, strict=True))))


class TeacherKLShaper(AdvantageShaper):
    """Adds each dataset's teacher term to the advantages (see the module docstring)."""

    def __init__(self, service_client: tinker.ServiceClient, kl_penalty_coef: float, kl_discount_factor: float
                 ) -> None:
        self.service_client = service_client
        self.kl_penalty_coef = kl_penalty_coef
        self.kl_discount_factor = kl_discount_factor
        self._clients: dict[TeacherConfig, tinker.SamplingClient] = {}

    def client(self, teacher: TeacherConfig) -> tinker.SamplingClient:
        """The teacher's sampling client, made once per teacher."""
        if teacher not in self._clients:
            self._clients[teacher] = teacher.sampling_client(self.service_client)
        return self._clients[teacher]

    async def __call__(self, data_D: list[tinker.Datum], sources_D: list[DatumSource],
                       builders_P: Sequence[EnvGroupBuilder]) -> tuple[list[tinker.Datum], dict[str, float]]:
        tagged = [builders_P[s.group_idx] for s in sources_D]
        for builder in tagged:
            if not isinstance(builder, TeacherGroupBuilder):
                raise ConfigurationError(
                    f"advantage_shaper=TeacherKLShaperBuilder got a group of {type(builder).__name__}, which names "
                    "no teacher; use dataset_builder=CompositeDatasetBuilder(dataset_configs=[...]) so that each "
                    "dataset carries its teacher")
        groups = [b for b in tagged if isinstance(b, TeacherGroupBuilder)]
        teacher_D = await teacher_logprobs(data_D, [self.client(b.teacher) for b in groups])
        new_data: list[tinker.Datum] = []
        kl_sum: dict[int, float] = {}
        tokens: dict[int, float] = {}
        for datum, teacher, builder in zip(data_D, teacher_D, groups, strict=True):
            sampled = datum.loss_fn_inputs["logprobs"].to_numpy()
            mask = datum.loss_fn_inputs["mask"].to_numpy()
            if teacher.shape != sampled.shape:
                raise ValueError(f"the teacher scored {teacher.shape[0]} tokens of a {sampled.shape[0]}-token datum")
            term, reverse_kl = teacher_kl_advantages(sampled, teacher, mask, self.kl_penalty_coef,
                                                     self.kl_discount_factor)
            inputs = dict(datum.loss_fn_inputs)
            advantages = datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64) + term
            inputs["advantages"] = tinker.TensorData.from_numpy(advantages.astype(np.float32))
            new_data.append(tinker.Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
            k = builder.dataset_index
            kl_sum[k] = kl_sum.get(k, 0.0) + float(reverse_kl.sum())
            tokens[k] = tokens.get(k, 0.0) + float(mask.sum())
        return new_data, teacher_kl_metrics(kl_sum, tokens)


def teacher_kl_metrics(kl_sum: dict[int, float], tokens: dict[int, float]) -> dict[str, float]:
    """``teacher_kl`` over all sampled tokens and ``teacher_kl/dataset_<k>`` per dataset (token-weighted means)."""
    total = sum(tokens.values())
    metrics = {"teacher_kl": sum(kl_sum.values()) / total} if total > 0 else {}
    metrics.update({f"teacher_kl/dataset_{k}": kl_sum[k] / n for k, n in sorted(tokens.items()) if n > 0})
    return metrics


@chz.chz
class TeacherKLShaperBuilder(AdvantageShaperBuilder):
    """On-policy distillation's advantage term: ``rl.train.Config(advantage_shaper=TeacherKLShaperBuilder())``."""

    kl_penalty_coef: float = 1.0
    """Weight of the per-token reverse KL to the teacher in the advantages."""
    kl_discount_factor: float = 0.0
    """γ: each token's term also counts, discounted, for the tokens before it in the reply (0: only its own)."""

    @chz.validate
    def _check(self) -> None:
        if self.kl_penalty_coef <= 0:
            raise ConfigurationError(f"kl_penalty_coef={self.kl_penalty_coef} must be > 0 (the teacher's weight)")
        if not 0 <= self.kl_discount_factor < 1:
            raise ConfigurationError(f"kl_discount_factor={self.kl_discount_factor} must be in [0, 1)")

    def __call__(self, service_client: tinker.ServiceClient) -> TeacherKLShaper:
        return TeacherKLShaper(service_client, self.kl_penalty_coef, self.kl_discount_factor)

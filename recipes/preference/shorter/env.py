"""A judge that prefers the shorter of two replies the quality judge finds equally good.

``PreferenceModelShorter(quality, tie_margin)``: when ``quality`` (a trained preference model, RLHF's stage 2) is
given and its P(A better) is further than ``tie_margin`` from 0.5, its verdict stands; otherwise, and always
without ``quality``, the shorter reply (in characters) wins: P(A better) = 1, 0 or 0.5 for equal lengths. Used as
the preference model of the pairwise self-play loop (``PairwisePreferenceRLDatasetBuilder``), the reward is a
reply's win fraction within its group, so among replies of equal quality the shorter ones gain.
"""

from __future__ import annotations

import chz

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.preference.preference_model import PreferenceModel, PreferenceModelBuilder
from tinker_cookbook.preference.types import Comparison, completion_text


def length_preference(comparison: Comparison) -> float:
    """P(A better) by length alone: 1 when A is shorter, 0 when longer, 0.5 when equally long."""
    len_a, len_b = len(completion_text(comparison.completion_A)), len(completion_text(comparison.completion_B))
    return 1.0 if len_a < len_b else 0.0 if len_a > len_b else 0.5


class PreferenceModelShorter(PreferenceModel):
    """The quality judge's verdict where it is clear, the shorter reply where it is not (see the module doc)."""

    def __init__(self, quality: PreferenceModel | None = None, tie_margin: float = 0.1) -> None:
        if not 0.0 <= tie_margin <= 0.5:
            raise ConfigurationError(f"tie_margin={tie_margin} must be in [0, 0.5]: the distance from 0.5 within "
                                     "which the quality judge's verdict counts as a tie")
        self.quality, self.tie_margin = quality, tie_margin

    async def prob_a_better(self, comparison: Comparison) -> float:
        if self.quality is not None:
            p = await self.quality(comparison)  # already averaged over both orders
            if abs(p - 0.5) > self.tie_margin:
                return p
        return length_preference(comparison)

    async def __call__(self, comparison: Comparison) -> float:
        # Both parts are symmetric in the order of A and B, so one evaluation is the order-averaged verdict.
        return await self.prob_a_better(comparison)


@chz.chz
class ShorterPreferenceModelBuilder(PreferenceModelBuilder):
    """Length alone (``model_path=None``), or length among replies stage 2's model at ``model_path`` ties."""

    tie_margin: float = 0.1
    """How close to 0.5 the quality judge's P(A better) must be to count as a tie (then the shorter reply wins)."""

    def __call__(self) -> PreferenceModel:
        quality = super().__call__() if self.model_path is not None else None
        return PreferenceModelShorter(quality, self.tie_margin)

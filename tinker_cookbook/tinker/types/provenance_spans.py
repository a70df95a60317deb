"""The official SDK's module path ``tinker.types.provenance_spans``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import PromptProvenanceSpan, ProvenanceSpans, SampledProvenanceSpan

__all__ = ["PromptProvenanceSpan", "ProvenanceSpans", "SampledProvenanceSpan"]

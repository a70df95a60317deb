"""Learning from pairwise preferences: comparison types, preference datasets, and the DPO loop.

- ``types``: ``Comparison`` (a prompt and two completions) and ``LabeledComparison`` (which one is preferred).
- ``preference_datasets``: comparison builders (``example``, ``jsonl``, ``hhh``, ``helpsteer3``, ``ultrafeedback``)
  and ``DPODatasetBuilder``, which renders pairs into chosen/rejected datums.
- ``train_dpo``: the DPO loop (``Config`` + ``main``); ``recipes/preference/dpo/train.py`` runs it.
"""

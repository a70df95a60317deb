"""Learning from pairwise preferences: comparison types, preference datasets, the DPO loop, and RLHF's parts.

- ``types``: ``Comparison`` (a prompt and two completions) and ``LabeledComparison`` (which one is preferred).
- ``preference_datasets``: comparison builders (``example``, ``rlhf_example``, ``jsonl``, ``hhh``, ``helpsteer3``, ``ultrafeedback``)
  and ``DPODatasetBuilder``, which renders pairs into chosen/rejected datums.
- ``train_dpo``: the DPO loop (``Config`` + ``main``); ``recipes/preference/dpo/train.py`` runs it.
- ``preference_model``: the pairwise preference model (trained to answer ``A`` or ``B``; ``PreferenceModel`` judges
  with its label logprobs, both orders averaged) and its training data.
- ``comparison_env``: pairwise self-play RL judged by a preference model (tournaments, win-fraction rewards).
  ``recipes/preference/rlhf/rlhf_pipeline.py`` chains SFT, the preference model and RL.
"""

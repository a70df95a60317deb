"""RL on environments written for the ``verifiers`` library (``python -m recipes.verifiers_rl.train``)."""

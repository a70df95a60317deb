"""RL toward shorter replies under a preference model (``python -m recipes.preference.shorter.train``)."""

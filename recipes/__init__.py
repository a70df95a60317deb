"""Runnable recipes: thin entry points that build a config and call a shared loop (``python -m recipes.<name>``)."""

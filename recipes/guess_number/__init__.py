"""Guess the number: multi-turn RL on the shared loop (``python -m recipes.guess_number.train``)."""

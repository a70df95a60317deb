"""Guess the number: multi-turn RL on the shared loop (``python -m recipes.multiplayer_rl.guess_number.train``)."""

"""Tic-tac-toe self-play RL on the shared loop (``python -m recipes.multiplayer_rl.text_arena.train``)."""

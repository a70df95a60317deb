"""``python -m recipes.code_rl.train``: RL on Python problems whose unit tests run in a local sandbox."""

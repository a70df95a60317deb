"""``python -m recipes.math_rl.train``: RL on math word problems."""

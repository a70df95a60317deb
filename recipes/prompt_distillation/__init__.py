"""``python -m recipes.prompt_distillation.create_data`` then ``.train``: distil a system prompt into a model."""

"""Twenty questions: multi-turn, two-model RL on the shared loop (``python -m recipes.multiplayer_rl.twenty_questions.train``)."""

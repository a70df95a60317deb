"""Twenty questions: multi-turn, two-model RL on the shared loop (``python -m recipes.twenty_questions.train``)."""

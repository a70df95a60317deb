"""Rubric-graded RL: a grader model scores replies against per-prompt criteria (``python -m recipes.rubric.train``)."""

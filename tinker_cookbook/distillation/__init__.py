"""Distillation from a teacher model to a student.

- On-policy (``train_on_policy``): the student samples replies, the teacher scores each sampled token, and the
  per-token advantage −coef · (log p_student − log p_teacher) trains the student through the shared RL loop
  (``rl.train.Config(advantage_shaper=TeacherKLShaperBuilder(...))``); ``datasets`` gives every dataset its teacher.
- Off-policy (``teacher_data``): the teacher writes replies to prompts into a JSONL file of conversations, and the
  shared supervised loop fine-tunes the student on them.

The recipes are ``recipes/distillation`` (also ``tinker_cookbook.recipes.distillation``); see docs/distillation.md.
"""

from tinker_cookbook.distillation import datasets, teacher_data, train_on_policy

__all__ = ["datasets", "teacher_data", "train_on_policy"]

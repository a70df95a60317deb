"""Distillation recipes: on-policy (the student samples, a teacher grades each token), multi-teacher, and
off-policy (SFT on teacher-written replies). See docs/distillation.md."""

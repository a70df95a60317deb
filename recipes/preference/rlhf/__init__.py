"""RLHF pipeline recipe (SFT, preference model, RL)."""

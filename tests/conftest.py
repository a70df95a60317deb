"""Test-wide settings: no model hub, and checkpoints in a throwaway store."""

import os
import tempfile

# Set before anything imports transformers/huggingface_hub, which read these at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ["TINKER_COOKBOOK_HOME"] = tempfile.mkdtemp(prefix="tinker-cookbook-test-home-")

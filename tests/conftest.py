"""Test-wide settings: no model hub, and checkpoints in a throwaway store."""

import os
import shutil
import tempfile

# Set before anything imports transformers/huggingface_hub, which read these at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
_HOME = tempfile.mkdtemp(prefix="tinker-cookbook-test-home-")
os.environ["TINKER_COOKBOOK_HOME"] = _HOME


def pytest_unconfigure(config) -> None:
    # A full run leaves some 400 MB of checkpoints in this store: without this, every run added that much to /tmp.
    shutil.rmtree(_HOME, ignore_errors=True)

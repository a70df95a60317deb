"""Test-wide settings: no model hub, and checkpoints in a throwaway store."""

import logging
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

# The official SDK keeps a session's heartbeat going for as long as its client object lives, and warns on stderr
# every few seconds once the server is gone. Tests stop their throwaway servers while such objects may still await
# collection, and those warnings then land in whatever later test is reading stderr (a CLI's one-line error).
logging.getLogger("tinker.lib.internal_client_holder").setLevel(logging.ERROR)


def pytest_unconfigure(config) -> None:
    # A full run leaves some 400 MB of checkpoints in this store: without this, every run added that much to /tmp.
    shutil.rmtree(_HOME, ignore_errors=True)

"""A recipe given bad input prints one clear error line and exits 1, without a traceback."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_model_is_one_error_line():
    result = subprocess.run([sys.executable, "-m", "recipes.quickstart", "model_name=acme/not-a-model"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1
    assert "Error:" in result.stderr and "acme/not-a-model" in result.stderr
    assert "Traceback" not in result.stderr

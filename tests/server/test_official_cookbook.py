"""The official cookbook's (registry ``tinker-cookbook==0.6.1``) supervised and RL loops, unchanged, through this
project's Tinker-protocol server on the tiny model.

Both packages are named ``tinker_cookbook``, so the official one lives in a folder of its own (``scripts/install.sh``
puts it in ``.official-cookbook/``, or set ``TINKER_COOKBOOK_OFFICIAL_DIR``) and runs in a subprocess whose
``PYTHONPATH`` puts it first, from a folder outside this repository. ``official_cookbook_driver.py`` holds the
data (a tiny dataset and environment on the official types); the loops are the official ``supervised.train.main``
and ``rl.train.main``. Two steps each; the RL loop's datums carry provenance spans, as it always sends them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinker_cookbook.base.tokenizers import get_tokenizer

REPO = Path(__file__).resolve().parents[2]
OFFICIAL = Path(os.environ.get("TINKER_COOKBOOK_OFFICIAL_DIR", REPO / ".official-cookbook"))
DRIVER = Path(__file__).with_name("official_cookbook_driver.py")
MODEL = "tinker-cookbook/tiny-smollm2"

pytestmark = pytest.mark.skipif(
    not (OFFICIAL / "tinker_cookbook").is_dir(),
    reason=f"the official tinker-cookbook is not installed in {OFFICIAL} (scripts/install.sh installs it there)")


def test_official_sl_and_rl_loops_train_through_the_server(server_url: str, tmp_path: Path) -> None:
    """About 40 s on 2 cores, most of it the official package's imports (one subprocess runs both loops)."""
    tokenizer_dir = tmp_path / "tokenizer"
    get_tokenizer(MODEL).save_pretrained(tokenizer_dir)
    env = {**os.environ, "PYTHONPATH": str(OFFICIAL), "TINKER_API_KEY": "tml-test-key", "TINKER_TELEMETRY": "0",
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    # cwd outside the repository, so that this project's tinker_cookbook is not the one imported.
    done = subprocess.run([sys.executable, str(DRIVER), "sl,rl", server_url, MODEL, str(tokenizer_dir),
                           str(tmp_path / "log")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"an official loop failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cookbook"].startswith(str(OFFICIAL))  # the registry's package ran, not this project's
    for mode in ("sl", "rl"):
        steps = [m for m in result["metrics"][mode] if "grad_norm" in m]
        assert [m["step"] for m in steps] == [1.0, 2.0], mode
        # Each step computed a non-zero gradient on the server and moved the adapter.
        assert all(m["grad_norm"] > 0 and m["update_norm"] > 0 for m in steps), (mode, steps)
    # The RL loop sampled its groups (2 groups of 4 per step) through the server's sampling clients.
    assert [m["env/all/total_episodes"] for m in result["metrics"]["rl"] if "grad_norm" in m] == [8, 8]

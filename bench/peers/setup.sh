#!/usr/bin/env bash
# The bench-only environment for the peer benchmarks (bench/bench_peer_*.py): TRL and llama-cpp-python.
#
#   bash bench/peers/setup.sh                 # creates bench/.venv-peers (gitignored)
#   PYTHON=/path/to/python bash bench/peers/setup.sh
#   bash bench/peers/setup.sh trl             # only TRL (or only llama-cpp); run again to add the other
#
# It sees the project's own venv's packages (a .pth file), so torch, transformers, peft and the project
# are the very same installs as the engine's; a constraints file holds them at the project's pins while pip adds
# the peers, so installing a peer never moves them. llama-cpp-python compiles llama.cpp from source with cmake
# (a C/C++ compiler and cmake are needed; several minutes on 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
VENV="$ROOT/bench/.venv-peers"
TRL_VERSION=1.16.0
LLAMA_CPP_VERSION=0.3.36
WHAT="${1:-all}"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# A .pth file puts the project venv's site-packages after this venv's own: `venv --system-site-packages` would
# only reach the base interpreter's, not the project venv's.
SITE="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PEER_SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" > "$PEER_SITE/project-venv.pth"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
# Every package the project's venv already has stays at its version.
"$PYTHON" -m pip freeze --exclude-editable | grep -v '^-e ' | grep '==' > "$CONSTRAINTS"
if [ "$WHAT" != llama-cpp ]; then
    "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" "trl==$TRL_VERSION"
fi
if [ "$WHAT" != trl ]; then
    # Release build of llama.cpp for this CPU (its default: native instructions); no server/tools needed.
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$VENV/bin/python" -m pip install --quiet --no-cache-dir -c "$CONSTRAINTS" "llama-cpp-python==$LLAMA_CPP_VERSION"
fi
"$VENV/bin/python" -m pip check || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("trl", "llama_cpp_python", "torch", "transformers", "peft"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
PY

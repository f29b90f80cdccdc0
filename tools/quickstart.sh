#!/usr/bin/env bash
# The main job on a fresh machine: install what the build needs (Debian/Ubuntu, as root), build,
# precompile the bundled example layouts into a cache directory, and, where a GPU is present, run
# the ops on the GPU and check them against the CPU reference.
#   tools/quickstart.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

packages="cmake g++ make libfmt-dev nlohmann-json3-dev libspdlog-dev libgtest-dev libcli11-dev libxxhash-dev"
missing=""
if command -v dpkg-query >/dev/null; then
  for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
fi
if [ -n "$missing" ]; then
  echo "== installing:$missing"
  if [ "$(id -u)" != 0 ]; then echo "need root to install:$missing" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
if ! command -v nvcc >/dev/null && [ ! -e /usr/local/cuda/include/nvrtc.h ]; then
  echo "the CUDA toolkit (NVRTC and its headers) is needed: install it under /usr/local/cuda" >&2
  exit 1
fi

# The Python package's interpreter: python3, or a virtual environment in the build tree where the
# system's Python refuses packages (PEP 668). ctest runs the Python tests with it.
py=${BSJIT_PYTHON:-python3}
if ! "$py" -m pip --version >/dev/null 2>&1 || "$py" -c 'import sys, sysconfig, os; \
    sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) and sys.prefix == sys.base_prefix else 1)'; then
  echo "== a virtual environment for the Python package ($build/venv)"
  python3 -m venv "$build/venv"
  py="$build/venv/bin/python"
fi
case "$py" in
  */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;;  # a path: made absolute for ctest
  *) py=$(command -v "$py") ;;
esac

echo "== build ($build)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBSJIT_WERROR=ON -DBSJIT_TEST_PYTHON="$py" >/dev/null
cmake --build "$build" -j"$(nproc)"

echo "== the Python package (pip install .; torch too where missing)"
"$py" -c 'import torch' 2>/dev/null || "$py" -m pip install -q torch
"$py" -m pip install -q numpy pytest
"$py" -m pip install -q .

echo "== precompile the example layouts and attention masks (examples/manifest.json; no GPU needed)"
cache="$build/example-kernel-cache"
"$build/tools/bsjit" --cache-dir "$cache" precompile -m examples/manifest.json

"$build/tools/bsjit" info
if "$build/tools/bsjit" info --require-gpu >/dev/null 2>&1; then
  echo "== GPU present: run and check the ops"
  "$build/tools/bsjit" --cache-dir "$cache" run -l examples/layouts/random_d25.npy -l examples/layouts/banded.json \
    -b 32 -t bf16,f32 -n 1000
else
  echo "== no GPU here: skipping the GPU run"
fi

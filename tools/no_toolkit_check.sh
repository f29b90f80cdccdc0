#!/usr/bin/env bash
# Builds the library and the CLI as a machine with torch and no CUDA toolkit would (the toolkit
# hidden from CMake: NVRTC and cuda.h come from torch's CUDA wheels), checks that libbsjit loads
# NVRTC from those wheels, and precompiles a bundled layout with it.
#   tools/no_toolkit_check.sh [build-dir] [python]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-no-toolkit}
py=${2:-python3}
"$py" -c 'import nvidia' 2>/dev/null || { echo "no_toolkit_check: $py has no CUDA wheels (pip install torch)" >&2; exit 1; }
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  -DPython_EXECUTABLE="$(command -v "$py")" -DBSJIT_BUILD_TESTS=OFF | grep "bsjit:"
cmake --build "$build" -j"$(nproc)" --target bsjit_cli
nvrtc=$(ldd "$build/libbsjit.so"* | awk '/libnvrtc/ {print $3; exit}')
echo "libnvrtc: $nvrtc"
case "$nvrtc" in
  */site-packages/nvidia/*) ;;
  *) echo "no_toolkit_check: libbsjit does not load NVRTC from torch's wheels" >&2; exit 1 ;;
esac
cache=$(mktemp -d)
env -u LD_LIBRARY_PATH "$build/tools/bsjit" --cache-dir "$cache" precompile -l examples/layouts/banded.json \
  -o forward,backward_weight -b 32 -t bf16 -a sm_90a,sm_80
ls "$cache"/*.bsjit | wc -l | xargs echo "entries:"
rm -rf "$cache"

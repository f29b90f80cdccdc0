#!/usr/bin/env bash
# One call on a GPU machine: the GPU tests, `bsjit run` on the bundled examples, and (when built)
# the benchmark; a short table last. The build tree is made on a machine with the build
# dependencies (tools/build.sh) and copied here: its binaries find libbsjit.so through $ORIGIN and
# need only the driver and libnvrtc on this machine.
#   tools/gpu_check.sh [build-dir] [gtest filter]
set -uo pipefail
build=${1:-build}
filter=${2:-*}
out=${OUT:-/tmp/bsjit-gpu-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true

status=()
start=$(date +%s)
"$build/tests/matmul_gpu_test" --gtest_filter="$filter" --gtest_brief=1 2>&1 | tee "$out/gpu_test.log" | tail -40
status+=("gpu tests: exit ${PIPESTATUS[0]}, $(grep -c '^\[       OK \]\|^\[  PASSED' "$out/gpu_test.log" || true) ok-lines, $(($(date +%s) - start)) s")

start=$(date +%s)
"$build/tools/bsjit" --no-disk-cache run -l examples/layouts/random_d25.npy -l examples/layouts/banded.json \
  -b 32 -t f32,bf16 -n 300 2>&1 | tee "$out/cli_run.log"
status+=("bsjit run examples: exit ${PIPESTATUS[0]}, $(($(date +%s) - start)) s")

if [ -x "$build/tools/bsjit_bench" ]; then
  "$build/tools/bsjit_bench" --json "$out/bench.json" --csv "$out/bench.csv" ${BSJIT_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
  status+=("bench: exit ${PIPESTATUS[0]}")
fi

echo
echo "== summary =="
grep '^GPU matmul:' "$out/gpu_test.log" || true
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu_test.log" | sort | uniq -c | sort -rn | head -20
for s in "${status[@]}"; do echo "$s"; done

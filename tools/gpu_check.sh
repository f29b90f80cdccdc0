#!/usr/bin/env bash
# One call on a GPU machine: the GPU tests, `bsjit run` on the bundled examples, and (when built)
# the benchmark; a short table last. The build tree is made on a machine with the build
# dependencies (tools/quickstart.sh, or cmake as there) and copied here: its binaries find
# libbsjit.so through $ORIGIN and need only the driver and libnvrtc on this machine.
#   tools/gpu_check.sh [build-dir] [gtest filter]
# BSJIT_GPU_TESTS: the test programs to run (default: all); BSJIT_GPU_PARALLEL=N: run them side by
# side, matmul_gpu_test and attention_gpu_test in N shards each (GTEST_TOTAL_SHARDS), each with a
# kernel cache of its own: the whole suite in about 450 s instead of about 900 (N = 3; the programs
# compile and compute their double references on the CPU cores while others run; on an H100 with
# 16 cores at 358ea85 attention_gpu_test alone did not end within 430 s, its 8 shards in 164); BSJIT_BENCH_ARGS: the benchmark's arguments ("none": no benchmark);
# BSJIT_GPU_DEADLINE=S: stop the tests S seconds after the start (exit 124 in the summary, with the
# tests a program had started and not ended: where it hung), so that a call's own time limit never
# cuts off the summary (give S under that limit, with room for the rest). The logs are line-buffered
# and keep gtest's RUN and OK lines. A line is printed as each program (or shard) ends; the shards'
# logs are merged into one file at the end (the device tool brings back only a few files).
set -uo pipefail
build=${1:-build}
filter=${2:-*}
out=${OUT:-/tmp/bsjit-gpu-check}
mkdir -p "$out"
began=$(date +%s)
left() {  # seconds the tests may still run: a timeout(1) duration
  if [ -z "${BSJIT_GPU_DEADLINE:-}" ]; then echo 0; return; fi  # 0: no limit
  local s=$((BSJIT_GPU_DEADLINE - ($(date +%s) - began)))
  echo $((s > 1 ? s : 1))
}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true

status=()
tests=${BSJIT_GPU_TESTS:-matmul_gpu_test conv_gpu_test attention_gpu_test attention_ops_gpu_test deploy_gpu_test context_gpu_test}
rcs=$(mktemp -d)  # exit codes, out of $out (the device tool brings back only a few files)
result() {  # test log → "exit code, gtest's summary lines" and, past the deadline, the test it was in
  local rc
  rc=$(cat "$rcs/$(basename "$1")")
  echo "exit $rc, $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' ')$([ "$rc" = 124 ] && unfinished "$1")"
}
unfinished() {  # the tests a log started and never ended (a program stopped at the deadline)
  awk '/^\[ RUN      \] / { started[$4] = NR; next }
       /^\[ +(OK|FAILED|SKIPPED) +\] / { name = $0; sub(/^\[[^]]*\] /, "", name); sub(/[ ,].*/, "", name); delete started[name] }
       END { for (t in started) names = names " " t; if (names != "") print "stopped in:" names }' "$1"
}
if [ -n "${BSJIT_GPU_PARALLEL:-}" ]; then
  start=$(date +%s)
  runs=()
  for t in $tests; do
    shards=1
    [ "$t" = matmul_gpu_test ] || [ "$t" = attention_gpu_test ] && shards=$BSJIT_GPU_PARALLEL
    for s in $(seq 0 $((shards - 1))); do
      log="$out/$t.$s.log"
      runs+=("$log")
      (GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s BSJIT_CACHE_DIR=$(mktemp -d) \
        timeout "$(left)" stdbuf -oL -eL "$build/tests/$t" --gtest_filter="$filter" > "$log" 2>&1
        echo $? > "$rcs/$(basename "$log")"
        echo "ended: $(basename "$log" .log): $(result "$log") $(($(date +%s) - start)) s") &
    done
  done
  wait
  for log in "${runs[@]}"; do status+=("$(basename "$log" .log): $(result "$log")"); done
  status+=("tests side by side: $(($(date +%s) - start)) s")
  for t in $tests; do  # one log per program: its shards' in order
    [ -f "$out/$t.0.log" ] || continue
    for log in "$out/$t".*.log; do echo "=== $(basename "$log")"; cat "$log"; done > "$out/$t.log"
    rm -f "$out/$t".*.log
  done
else
  for t in $tests; do
    start=$(date +%s)
    timeout "$(left)" stdbuf -oL -eL "$build/tests/$t" --gtest_filter="$filter" 2>&1 | tee "$out/$t.log" | grep -v '^\[ \(RUN\|      OK\) ' | tail -40
    echo "${PIPESTATUS[0]}" > "$rcs/$t.log"
    status+=("$t: $(result "$out/$t.log") $(($(date +%s) - start)) s")
  done
fi

start=$(date +%s)
"$build/tools/bsjit" --no-disk-cache run -l examples/layouts/random_d25.npy -l examples/layouts/banded.json \
  -b 32 -t f32,bf16 -n 300 2>&1 | tee "$out/cli_run.log"
status+=("bsjit run examples: exit ${PIPESTATUS[0]}, $(($(date +%s) - start)) s")

if [ -x "$build/tools/bsjit-bench" ] && [ "${BSJIT_BENCH_ARGS:-}" != "none" ]; then
  start=$(date +%s)
  "$build/tools/bsjit-bench" --json "$out/bench.json" --csv "$out/bench.csv" ${BSJIT_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
  status+=("bench: exit ${PIPESTATUS[0]}, $(($(date +%s) - start)) s")
fi

# suite A's baselines (SDPA, FlexAttention) in the same call, where torch is installed
if [[ " ${BSJIT_BENCH_ARGS:-} " == *A* ]] && python3 -c "import torch, triton" 2>/dev/null; then
  start=$(date +%s)
  python3 "$(dirname "$0")/bench/torch_attention.py" --json "$out/torch_attention.json" 2>&1 | tee "$out/torch_attention.log"
  status+=("torch attention baselines: exit ${PIPESTATUS[0]}, $(($(date +%s) - start)) s")
fi

echo
echo "== summary =="
grep -h '^GPU matmul:\|^GPU [0-9]:' "$out"/*_test*.log || true
grep -h '^\[  FAILED  \] ' "$out"/*_test*.log | head -20 || true
for s in "${status[@]}"; do echo "$s"; done
# the call fails where any test program, the examples' run or the benchmark (a WRONG cell) did
failed=0
for f in "$rcs"/*; do [ "$(cat "$f")" = 0 ] || failed=1; done
for s in "${status[@]}"; do [[ "$s" =~ exit\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" != 0 ] && failed=1; done
[ -f "$out/bench.log" ] && sed -n '/^== suite W/,$p' "$out/bench.log"
[ -f "$out/torch_attention.log" ] && grep "^torch" "$out/torch_attention.log"
if [ $failed != 0 ]; then echo "gpu_check: FAILED (a test program, the examples' run or the benchmark exited non-zero)"; fi
exit $failed

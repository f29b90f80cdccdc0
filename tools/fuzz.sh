#!/usr/bin/env bash
# libFuzzer runs of the readers that take input other programs wrote: .npy and JSON layouts,
# manifests, cache entries (tests/fuzz). Builds the library with clang, instrumented for the fuzzer
# and with AddressSanitizer and UndefinedBehaviorSanitizer (float-cast-overflow included, every
# finding fatal), then runs each target for SECONDS on a copy of its seed corpus
# (tests/fuzz/corpus/<target>). A finding stops its run with exit 1 and leaves the input in
# BUILD/fuzz-findings/ (each becomes a regression test); the last line counts the runs.
#   tools/fuzz.sh [SECONDS (60)] [BUILD (build-fuzz)]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${2:-build-fuzz}
command -v clang++ >/dev/null || { echo "tools/fuzz.sh needs clang++ (Debian: apt-get install clang libclang-rt-dev)" >&2; exit 1; }
flags="-fsanitize=fuzzer-no-link,address,undefined -fsanitize=float-cast-overflow -fno-sanitize-recover=all -g"
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" \
  -DBSJIT_FUZZ=ON -DBSJIT_BUILD_TESTS=OFF -DBSJIT_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target layout_npy_fuzz layout_json_fuzz manifest_fuzz cache_entry_fuzz conv_layout_fuzz
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
findings="$build/fuzz-findings"
mkdir -p "$findings"
status=0 summary=""
for t in layout_npy layout_json manifest cache_entry conv_layout; do
  work="$build/fuzz-corpus/$t"
  rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/$t/* "$work/"
  log="$build/fuzz-$t.log"
  if "$build/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$findings/$t-" "$work" > "$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    [ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    summary+="$t: ${runs:-?} runs, no finding; "
  else
    status=1
    summary+="$t: FINDING (see $log, inputs in $findings); "
    tail -n 30 "$log"
  fi
done
echo "fuzz ($seconds s each): $summary"
exit $status

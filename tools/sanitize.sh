#!/usr/bin/env bash
# Runs the GPU test programs under compute-sanitizer's memcheck, racecheck, synccheck and initcheck
# and says, per program and tool, how many errors each reported; exits 1 when any did.
#   tools/sanitize.sh [-b build-dir] [-t tool,...] [-o log-dir] [program[:gtest-filter] ...]
# With no program, every GPU test program under reduced filters (below): racecheck and synccheck
# run the kernels some 10-100× slower, so the defaults keep one case of each family. Kernels a tool
# cannot model are excluded from that tool by tools/sanitize_suppressions.txt, one line each:
#   <tool> <kernel-name substring> <why the report is not a bug>
# (passed as --kernel-name-exclude kns=<substring>); a line without a reason is refused.
# COMPUTE_SANITIZER and SANITIZE_SUPPRESSIONS name another sanitizer binary or suppression file.
# Each run's full report is kept in the log directory (default: a fresh temporary one).
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
tools=memcheck,racecheck,synccheck,initcheck
logs=""
while getopts "b:t:o:" opt; do
  case $opt in
    b) build=$OPTARG ;;
    t) tools=$OPTARG ;;
    o) logs=$OPTARG ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
sanitizer=${COMPUTE_SANITIZER:-compute-sanitizer}
command -v "$sanitizer" > /dev/null || { echo "sanitize: $sanitizer not found (the CUDA toolkit's bin)" >&2; exit 2; }
[ -n "$logs" ] || logs=$(mktemp -d)
mkdir -p "$logs"
suppressions=${SANITIZE_SUPPRESSIONS:-tools/sanitize_suppressions.txt}

programs=("$@")
if [ ${#programs[@]} -eq 0 ]; then
  programs=(
    "matmul_gpu_test:All/MatMulGpu.*b32*bf16*:MatMulGpuSplit.*"
    "attention_gpu_test:*b64_d64_bf16_bshd*"
    "attention_ops_gpu_test:*"
    "conv_gpu_test:*TensorCore*bf16_ndhwc"
    "deploy_gpu_test:*"
    "context_gpu_test:*"
  )
fi

# the --kernel-name-exclude options of a tool's suppressions
excludes() {
  [ -f "$suppressions" ] || return 0
  local line=0 tool kernel reason
  while read -r tool kernel reason; do
    line=$((line + 1))
    case "$tool" in "" | \#*) continue ;; esac
    if [ -z "$kernel" ] || [ -z "$reason" ]; then
      echo "sanitize: $suppressions line $line: '<tool> <kernel substring> <reason>' expected" >&2
      return 1
    fi
    if [ "$tool" = "$1" ]; then printf '%s\n' "--kernel-name-exclude" "kns=$kernel"; fi
  done < "$suppressions"
  return 0
}

status=0
for tool in ${tools//,/ }; do
  excludes "$tool" > /dev/null || exit 2
  mapfile -t skip < <(excludes "$tool")
  for entry in "${programs[@]}"; do
    program=${entry%%:*}
    filter='*'
    [ "$entry" != "$program" ] && filter=${entry#*:}
    log="$logs/$program-$tool.log"
    "$sanitizer" --tool "$tool" --print-limit 50 "${skip[@]}" "$build/tests/$program" --gtest_filter="$filter" \
      --gtest_brief=1 > "$log" 2>&1
    rc=$?
    # memcheck, synccheck and initcheck end with "ERROR SUMMARY: N errors"; racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)"
    summary=$(grep -E "ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: .*\([0-9]+ errors" "$log" | tail -1)
    errors=$(sed -nE 's/.*ERROR SUMMARY: ([0-9]+).*/\1/p; s/.*RACECHECK SUMMARY: .*\(([0-9]+) errors.*/\1/p' <<< "$summary")
    if [ -z "$errors" ]; then
      echo "$tool $program: no summary (exit $rc; see $log)"
      status=1
    elif [ "$errors" -gt 0 ] || [ $rc -ne 0 ]; then
      echo "$tool $program: $errors errors, exit $rc (see $log)"
      status=1
    else
      echo "$tool $program: clean"
    fi
  done
done
echo "logs: $logs"
exit $status

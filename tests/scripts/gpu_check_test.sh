#!/usr/bin/env bash
# tools/gpu_check.sh against stand-in test programs (no GPU): the summary's exit codes and gtest
# lines, the test a program was in when the deadline stopped it (in order and side by side), and
# the call's verdict.
set -uo pipefail
script="$(cd "$(dirname "$0")/../.." && pwd)/tools/gpu_check.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$work/build/tests" "$work/build/tools"

# a program that passes two tests; one that fails one; one that hangs in its second test
cat > "$work/build/tests/pass_gpu_test" <<'STUB'
#!/usr/bin/env bash
for t in A.One All/P.Two/b64_d128; do echo "[ RUN      ] $t"; echo "[       OK ] $t (1 ms)"; done
echo "[  PASSED  ] 2 tests."
STUB
cat > "$work/build/tests/fail_gpu_test" <<'STUB'
#!/usr/bin/env bash
echo "[ RUN      ] All/F.Grad/b128_d64"
echo "[  FAILED  ] All/F.Grad/b128_d64, where GetParam() = 4-byte object <80-00 00-00> (3 ms)"
echo "[  PASSED  ] 0 tests."
echo "[  FAILED  ] 1 test, listed below:"
exit 1
STUB
cat > "$work/build/tests/hang_gpu_test" <<'STUB'
#!/usr/bin/env bash
echo "[ RUN      ] H.Quick"
echo "[       OK ] H.Quick (1 ms)"
echo "[ RUN      ] All/H.Backward/b128_d128"
exec sleep 30
STUB
printf '#!/usr/bin/env bash\necho "bsjit run stand-in"\n' > "$work/build/tools/bsjit"
chmod +x "$work/build/tests/"* "$work/build/tools/bsjit"
cd "$work"
mkdir bin && printf '#!/bin/sh\nexit 1\n' > bin/nvidia-smi && chmod +x bin/nvidia-smi
export PATH="$work/bin:$PATH" BSJIT_BENCH_ARGS=none

for parallel in "" 2; do
  out=$(OUT="$work/out$parallel" BSJIT_GPU_PARALLEL=$parallel BSJIT_GPU_DEADLINE=3 \
    BSJIT_GPU_TESTS="pass_gpu_test fail_gpu_test hang_gpu_test" "$script" build 2>&1)
  rc=$?
  [ $rc = 1 ] || fail "a failing and a hung program: exit $rc (parallel '$parallel'): $out"
  grep -q "pass_gpu_test[.0-9]*: exit 0, \[  PASSED  \] 2 tests." <<< "$out" || fail "the passing program's line: $out"
  grep -q "fail_gpu_test[.0-9]*: exit 1," <<< "$out" || fail "the failing program's line: $out"
  grep -q "hang_gpu_test[.0-9]*: exit 124, .*stopped in: All/H.Backward/b128_d128" <<< "$out" ||
    fail "the hung program's line names the test it was in (parallel '$parallel'): $out"
  grep -q "stopped in:.*H.Quick" <<< "$out" && fail "a test that ended is named as unfinished: $out"
  grep -q "stopped in:.*F.Grad" <<< "$out" && fail "a failed test is named as unfinished: $out"
  grep -q "^\[  FAILED  \] All/F.Grad/b128_d64" <<< "$out" || fail "the failed test in the summary: $out"
  [ -s "$work/out$parallel/hang_gpu_test.log" ] || fail "no log of the hung program (parallel '$parallel')"
done

out=$(OUT="$work/out-ok" BSJIT_GPU_TESTS="pass_gpu_test" "$script" build 2>&1) || fail "a passing run exits $?: $out"
grep -q "FAILED" <<< "$out" && fail "a passing run reports a failure: $out"
echo "gpu_check_test: ok"

#!/usr/bin/env bash
# tools/sanitize.sh against a stand-in compute-sanitizer (no GPU): the runs it makes per tool and
# program, the suppressions it passes, and its verdicts: clean, errors, no summary, a malformed
# suppression line.
set -uo pipefail
script="$(cd "$(dirname "$0")/../.." && pwd)/tools/sanitize.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The stand-in records its arguments and reports 3 errors (exiting 0, as the tool does by default
# when the program passes) for programs named in $BAD, no
# summary at all for programs named in $CRASH.
cat > "$work/sanitizer" <<'STUB'
#!/usr/bin/env bash
echo "$*" >> "$CALLS"
for a in "$@"; do
  case "$a" in
    */tests/*) program=${a##*/} ;;
  esac
done
case " ${CRASH:-} " in *" $program "*) echo "segfault"; exit 139 ;; esac
case "$*" in *"--tool racecheck"*) racecheck=1 ;; *) racecheck=0 ;; esac
errors=0
case " ${BAD:-} " in *" $program "*) errors=3 ;; esac
# racecheck's summary has its own form
if [ $racecheck = 1 ]; then
  echo "========= RACECHECK SUMMARY: $errors hazards displayed ($errors errors, 2 warnings)"
else
  echo "========= ERROR SUMMARY: $errors errors"
fi
STUB
chmod +x "$work/sanitizer"
export COMPUTE_SANITIZER="$work/sanitizer" CALLS="$work/calls"
printf 'racecheck dsd_tma_kernel the copy engine writes the stages; racecheck sees no writer\n' > "$work/ok.txt"
export SANITIZE_SUPPRESSIONS="$work/ok.txt"

out=$("$script" -b /b -o "$work/logs" -t memcheck,racecheck one_test:A.* two_test) || fail "clean runs exit $?: $out"
[ "$(grep -c clean <<< "$out")" = 4 ] || fail "expected 4 clean runs: $out"
[ "$(wc -l < "$CALLS")" = 4 ] || fail "expected 4 sanitizer runs: $(cat "$CALLS")"
grep -q -- "--tool memcheck --print-limit 50 /b/tests/one_test --gtest_filter=A.\*" "$CALLS" || fail "memcheck call: $(cat "$CALLS")"
[ "$(grep -c -- "--kernel-name-exclude kns=dsd_tma_kernel" "$CALLS")" = 2 ] || fail "racecheck excludes: $(cat "$CALLS")"
grep -- "--tool memcheck" "$CALLS" | grep -q -- "--kernel-name-exclude" && fail "memcheck took racecheck's suppression"
grep -q -- "--gtest_filter=\*" "$CALLS" || fail "a program without a filter runs every test"

out=$(BAD=two_test "$script" -b /b -o "$work/logs" -t initcheck one_test two_test); rc=$?
[ $rc = 1 ] || fail "errors exit $rc"
grep -q "initcheck two_test: 3 errors" <<< "$out" || fail "errors not named: $out"
grep -q "initcheck one_test: clean" <<< "$out" || fail "the clean program: $out"

out=$(BAD=two_test "$script" -b /b -o "$work/logs" -t racecheck one_test two_test); rc=$?
[ $rc = 1 ] || fail "racecheck's errors exit $rc"
grep -q "racecheck two_test: 3 errors" <<< "$out" || fail "racecheck's errors not named: $out"
grep -q "racecheck one_test: clean" <<< "$out" || fail "racecheck's clean program (its warnings are not errors): $out"

out=$(CRASH=one_test "$script" -b /b -o "$work/logs" -t synccheck one_test); rc=$?
[ $rc = 1 ] || fail "a run without a summary exits $rc"
grep -q "synccheck one_test: no summary" <<< "$out" || fail "no summary not said: $out"

printf 'racecheck only_a_kernel\n' > "$work/bad.txt"
out=$(SANITIZE_SUPPRESSIONS="$work/bad.txt" "$script" -b /b -o "$work/logs" -t racecheck one_test 2>&1); rc=$?
[ $rc = 2 ] || fail "a suppression without a reason exits $rc"
grep -q "line 1" <<< "$out" || fail "the malformed line not named: $out"

out=$(COMPUTE_SANITIZER=/nonexistent "$script" one_test 2>&1); rc=$?
[ $rc = 2 ] && grep -q "not found" <<< "$out" || fail "a missing sanitizer: exit $rc, $out"
echo "sanitize.sh: all checks passed"

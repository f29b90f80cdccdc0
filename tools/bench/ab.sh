#!/usr/bin/env bash
# A/B of bsjit builds in one GPU call: every round runs bsjit-bench once per build, in turn, with
# the same arguments and a kernel cache per build, then compares the rounds' cells
# (tools/bench/compare.py). Interleaving the builds within each round keeps the machine's drift out
# of the comparison; two rounds or more show the cells' spread.
#
#   tools/bench/ab.sh snapshot BUILD DIR
#       copies BUILD's libbsjit and bsjit-bench into DIR (e.g. before changing the tree: the
#       baseline). Keep DIR untracked and carry it to the GPU machine.
#   tools/bench/ab.sh run ROUNDS "DIR..." BENCH-ARGS...
#       DIR: a snapshot or a build tree. Results: $AB_OUT (default /tmp/bsjit-ab)/DIR-ROUND.csv.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  sed -n '2,11p' "$0" >&2
  exit 2
}

# the benchmark binary and the folder holding its libbsjit, for a snapshot or a build tree
bench_of() { echo "$1/tools/bsjit-bench"; }
lib_of() { if ls "$1"/libbsjit.so* > /dev/null 2>&1; then echo "$1"; else echo "$1/lib"; fi; }

case "${1:-}" in
  snapshot)
    [ $# -eq 3 ] || usage
    build=$2 dir=$3
    [ -x "$build/tools/bsjit-bench" ] || { echo "ab.sh: $build/tools/bsjit-bench not found (build bsjit_bench first)" >&2; exit 1; }
    mkdir -p "$dir/tools"
    cp -L "$build"/libbsjit.so.? "$dir/" && cp "$build/tools/bsjit-bench" "$dir/tools/" || exit 1
    echo "snapshot of $build in $dir ($(git -C "$here" rev-parse --short HEAD 2>/dev/null)$(git -C "$here" diff --quiet 2>/dev/null || echo '+changes'))"
    ;;
  run)
    [ $# -ge 3 ] || usage
    rounds=$2 dirs=$3
    shift 3
    out=${AB_OUT:-/tmp/bsjit-ab}
    mkdir -p "$out"
    status=0
    for r in $(seq 1 "$rounds"); do
      files=()
      for d in $dirs; do
        name=$(basename "$d")
        log="$out/$name-$r.log"
        if ! BSJIT_CACHE_DIR="$out/cache-$name" LD_LIBRARY_PATH="$(lib_of "$d"):${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64" \
          "$(bench_of "$d")" "$@" --csv "$out/$name-$r.csv" > "$log" 2>&1; then
          echo "ab.sh: $d failed in round $r; the end of $log:" >&2
          tail -n 5 "$log" >&2
          status=1
          continue
        fi
        files+=("$out/$name-$r.csv")
      done
      echo "== round $r: $dirs"
      [ ${#files[@]} -gt 0 ] && python3 "$here/compare.py" "${files[@]}"
    done
    exit $status
    ;;
  *) usage ;;
esac

#!/usr/bin/env python3
"""Sustained rate, SM clock and board power of what bsjit-bench times, kernel by kernel.

Runs DIR's bsjit-bench (a build tree or an ab.sh snapshot) with the given arguments and --idle
(each timed run straight after the last, no L2 flush between: the GPU under sustained load, as in
training), while nvidia-smi samples the SM clock and the board power. Each line the benchmark
prints is then shown with the samples taken since its previous line (those drawing at least half
the power limit: the loaded part, not the compiles and CPU checks in between): the median SM clock,
the mean power and, where the line gives TFLOP/s, TFLOP/s per GHz (work per clock) and pJ per
FLOP (energy per unit of work). At the power limit the clock is what is left of the power budget,
so two kernels' sustained rates compare as their energy per FLOP, not their work per clock.
docs/PERFORMANCE.md, "Power and clocks" (H200, 2026-12-01).

    tools/bench/power.py [--flush] DIR BENCH-ARGS...
    e.g. tools/bench/power.py build -s sweep -b 128 -d 0.5 -o forward -r 12000

--flush keeps the benchmark's own timing (each run after a 256 MiB read) instead of --idle.

A line covers everything timed since the line before it: suite W's forward line also covers
cuSPARSE's run (printed on it), so there the sweep (`-s sweep -o forward -t TILES`) separates them.
Give -r large enough for each measurement to take a few seconds: the samples are 50 ms apart,
and nvidia-smi's power reading averages over about a second, so a short measurement's figures are
partly its neighbour's (at -r 2000 a 0.1 ms kernel gets 3-6 samples).
"""
import datetime
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

RATE = re.compile(r"([\d.]+) TF(?:LOP)?/s")


def smi_samples(path):
    out = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
            except (ValueError, IndexError):
                continue  # a header or a "[N/A]"
    return out


def main(args):
    flush = bool(args) and args[0] == "--flush"
    if flush:
        args = args[1:]
    if len(args) < 1:
        sys.exit(__doc__)
    build, bench_args = args[0], args[1:] + ([] if flush else ["--idle"])
    bench = os.path.join(build, "tools", "bsjit-bench")
    lib = build if glob.glob(os.path.join(build, "libbsjit.so*")) else os.path.join(build, "lib")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (lib, env.get("LD_LIBRARY_PATH", ""), "/usr/local/cuda/lib64") if p)
    log = f"/tmp/bsjit-power-{os.getpid()}.csv"
    query = "timestamp,clocks.sm,power.draw,power.limit"
    with open(log, "w") as f:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0",
                                "-lms", "50"], stdout=f, stderr=subprocess.DEVNULL)
    lines = []  # (time printed, text)
    try:
        time.sleep(0.5)
        start = time.time()
        # line-buffered, so that each line arrives when it is printed
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        proc = subprocess.Popen(line_buffered + [bench] + bench_args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        for text in proc.stdout:
            lines.append((time.time(), text.rstrip("\n")))
        status = proc.wait()
    finally:
        smi.terminate()
        smi.wait()
    samples = smi_samples(log)
    os.remove(log)
    previous = start
    for t, text in lines:
        loaded = [s for s in samples if previous <= s[0] <= t and s[2] >= 0.5 * s[3]]
        previous = t
        if not loaded:
            print(text)
            continue
        mhz = statistics.median(s[1] for s in loaded)
        watts = statistics.mean(s[2] for s in loaded)
        extra = f"  | {len(loaded):3d} samples  {mhz:5.0f} MHz  {watts:4.0f} W"
        m = RATE.search(text)
        if m:
            tflops = float(m.group(1))
            extra += f"  {tflops / (mhz / 1000):5.0f} TF/s per GHz  {watts / tflops:5.2f} pJ/FLOP"
        print(text + extra)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

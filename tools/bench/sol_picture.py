#!/usr/bin/env python3
"""A picture of a benchmark run: each suite's cells (layout, block, density) by op, shaded by their
speed-of-light fraction (SOL) and labelled with it and the TFLOP/s, as SVG. Reads bsjit-bench's
--json or --csv output.

    bsjit bench --suite W,layers --json run.json
    python3 tools/bench/sol_picture.py run.json -o run.svg
"""

import argparse
import csv
import html
import json
import sys

OPS = ("forward", "backward_data", "backward_weight")


def read_rows(path):
    """{suite: [row dict with layout, block, density, op, sol, tflops]}."""
    suites = {}
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["op"] not in OPS:
                    continue
                suites.setdefault(r["suite"], []).append(
                    {"layout": r["layout"], "block": int(r["block"]), "density": float(r["density"]), "op": r["op"],
                     "sol": float(r["sol"]), "tflops": float(r["tflops"])})
    else:
        with open(path) as f:
            j = json.load(f)
        for suite, rows in j.items():
            if isinstance(rows, list) and rows and "op" in rows[0] and "sol" in rows[0]:
                suites[suite] = [r for r in rows if r["op"] in OPS]
    return suites


def colour(sol):
    """White at 0 to deep blue at 1 (and past it)."""
    t = max(0.0, min(1.0, sol))
    r, g, b = (int(255 + (c - 255) * t) for c in (31, 78, 156))
    return f"#{r:02x}{g:02x}{b:02x}"


def svg(suites, title):
    cell_w, cell_h, label_w, top = 150, 26, 330, 50
    parts, y = [], top
    for suite, rows in suites.items():
        keys = []
        for r in rows:
            k = (r["layout"], r["block"], r["density"])
            if k not in keys:
                keys.append(k)
        by = {(r["layout"], r["block"], r["density"], r["op"]): r for r in rows}
        parts.append(f'<text x="10" y="{y - 8}" font-size="15" font-weight="bold">{html.escape(suite)}</text>')
        for i, op in enumerate(OPS):
            parts.append(f'<text x="{label_w + i * cell_w + 6}" y="{y + 14}" font-size="12">{op}</text>')
        y += 20
        for layout, block, density in keys:
            parts.append(f'<text x="10" y="{y + 17}" font-size="12">{html.escape(layout)}  b {block}  '
                         f'd {density:g}</text>')
            for i, op in enumerate(OPS):
                r = by.get((layout, block, density, op))
                x = label_w + i * cell_w
                if r is None:
                    continue
                sol = r["sol"]
                ink = "#fff" if sol > 0.55 else "#000"
                parts.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" '
                             f'fill="{colour(sol)}"><title>{sol:.3f}</title></rect>')
                parts.append(f'<text x="{x + 6}" y="{y + 17}" font-size="12" fill="{ink}">'
                             f'{sol:.2f}  ({r["tflops"]:.0f} TF/s)</text>')
            y += cell_h
        y += 40
    width = label_w + len(OPS) * cell_w + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" font-family="sans-serif">\n'
            f'<title>{html.escape(title)}</title>\n<text x="10" y="22" font-size="16">{html.escape(title)}: '
            f'SOL per cell (shade: 0 white, 1 blue)</text>\n' + "\n".join(parts) + "\n</svg>\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="bsjit-bench --json or --csv output")
    ap.add_argument("-o", "--output", required=True, help="the SVG to write")
    a = ap.parse_args(argv)
    suites = read_rows(a.results)
    if not suites:
        print(f"sol_picture: no matmul cells in {a.results}", file=sys.stderr)
        return 1
    with open(a.output, "w") as f:
        f.write(svg(suites, a.results))
    print(f"{a.output}: {sum(len(v) for v in suites.values())} cells of {len(suites)} suite(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

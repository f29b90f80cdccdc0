"""tools/bench/sol_picture.py on a benchmark result written here: a cell per (layout, block, density,
op), shaded by SOL, from the CSV and the JSON forms alike; tools/bench/compare.py on two CSV runs."""

import json
import pathlib
import runpy
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "bench"
TOOL = BENCH / "sol_picture.py"


def run(args, tool=TOOL):
    old = sys.argv
    sys.argv = [str(tool), *args]
    try:
        runpy.run_path(str(tool), run_name="__main__")
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = old
    return 0


def test_cells_from_csv_and_json(tmp_path):
    rows = [("layers", "12288x12288/balanced/8192", 32, 0.25, op, sol, 100 + i)
            for i, (op, sol) in enumerate([("forward", 0.31), ("backward_data", 0.30), ("backward_weight", 1.2)])]
    rows.append(("W", "balanced", 64, 0.5, "forward", 0.6, 500))
    csv_path = tmp_path / "run.csv"
    csv_path.write_text("suite,layout,block,density,op,ms,tflops,sol,vs_cublas,vs_cusparse,error,vs_dense_equivalent\n"
                        + "".join(f"{s},{l},{b},{d},{o},1,{t},{v},0,0,0,0\n" for s, l, b, d, o, v, t in rows))
    json_path = tmp_path / "run.json"
    json_path.write_text(json.dumps({"layers": [{"layout": l, "block": b, "density": d, "op": o, "sol": v, "tflops": t}
                                                for s, l, b, d, o, v, t in rows if s == "layers"],
                                     "copy_tbps": 4.2}))
    for src, cells in ((csv_path, 4), (json_path, 3)):
        out = tmp_path / (src.stem + src.suffix[1:] + ".svg")
        assert run([str(src), "-o", str(out)]) == 0
        svg = out.read_text()
        assert svg.startswith("<svg") and svg.count("<rect") == cells
        assert 'fill="#1f4e9c"' in svg, "SOL at or past 1: the full shade"
        assert "0.31  (100 TF/s)" in svg
    (tmp_path / "empty.csv").write_text("suite,layout,block,density,op,ms,tflops,sol\n")
    assert run([str(tmp_path / "empty.csv"), "-o", str(tmp_path / "e.svg")]) == 1


def test_compare_reads_quoted_layouts(tmp_path, capsys):
    # suite A's masks hold commas ("causal, 2 kv heads"): bsjit-bench quotes them (RFC 4180)
    head = "suite,layout,block,density,op,ms,tflops,sol,vs_cublas,vs_cusparse,error,vs_dense_equivalent\n"
    for name, tflops in (("a", (300, 400)), ("b", (330, 500))):
        (tmp_path / f"{name}.csv").write_text(head + f'A,"causal, 2 kv heads",128,128,attention_bwd,1,{tflops[0]},0,0,0,0,0\n'
                                              + f"A,causal,128,128,attention_bwd,1,{tflops[1]},0,0,0,0,0\n")
    assert run([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], BENCH / "compare.py") == 0
    out = capsys.readouterr().out
    assert "causal, 2 kv heads" in out and "x1.100" in out and "x1.250" in out
    assert "geomean attention_bwd   b128: x1.1726 (2 of 2 up, 1.100-1.250)" in out

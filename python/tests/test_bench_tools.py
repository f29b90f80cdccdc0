"""tools/bench/sol_picture.py on a benchmark result written here: a cell per (layout, block, density,
op), shaded by SOL, from the CSV and the JSON forms alike."""

import json
import pathlib
import runpy
import sys

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "bench" / "sol_picture.py"


def run(args):
    old = sys.argv
    sys.argv = [str(TOOL), *args]
    try:
        runpy.run_path(str(TOOL), run_name="__main__")
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

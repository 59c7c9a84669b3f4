"""The workbook on CPU: ceilings, sweeps (a failing point and resume), the notebooks (clean,
parameterized, all executed through papermill), reports. The cost model and the roofline are
tested in test_models.py, the counter parser in test_counters.py."""
from __future__ import annotations

import ast
import runpy
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from kdtree.bench import plots, roofline
from kdtree.bench.ceilings import Ceilings, measure_ceilings
from kdtree.bench.report import headline, load_run
from kdtree.bench.sweep import load_spec, plan, read_manifest, run_sweep, summary
from kdtree.bench.wheelhouse import installed_names, wheel_project
from workbook_run import ROOT, cpu_run

# An H200-like set of ceilings (numbers of the order measured there; the tests need no GPU).
H200 = Ceilings(device="NVIDIA H200", kind="gpu", hbm_bw=4.3e12, l2_bw=10e12, tensor_flops=780e12,
                fp32_flops=50e12, launch_eager_us=12.0, launch_graph_us=1.5, l2_bytes=60 << 20)


# ---- ceilings and figures ----

def test_cpu_ceilings_are_measured_and_labelled(tmp_path):
    c = measure_ceilings(quick=True, device="cpu")
    assert c.kind == "cpu" and "CPU host ceilings" in c.caption()
    assert all(getattr(c, f) > 0 for f in ("hbm_bw", "l2_bw", "tensor_flops", "fp32_flops", "launch_eager_us"))
    back = Ceilings.load(c.save(tmp_path / "c.json"))
    assert back.table().equals(c.table()) and back.methods == c.methods
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a ceilings file"):
        Ceilings.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="device"):
        measure_ceilings(device="tpu")


def test_every_figure_names_device_ceilings_l2_state_and_timing_mode():
    df = roofline.classify(pd.DataFrame(
        [{"kernel": "verify_attention", "variant": v, "q_len": n, "prefix": 4096, "batch": 1, "heads": 64,
          "mode": m, "l2": "cold", "median_us": 50.0 * n, "p20_us": 45.0 * n, "p80_us": 60.0 * n}
         for v in ("naive", "fused") for n in (9, 33) for m in ("eager", "graph")]), H200)
    figs = [plots.latency(df, "q_len", ["variant", "mode"], "t", H200), plots.bandwidth(df, "q_len", ["variant"], "b", H200),
            plots.roofline(df, H200, "r")]
    for fig, timing in zip(figs, ("eager+graph", "eager+graph", "graph")):   # the roofline leaves eager points out
        title = fig.layout.title.text
        assert "NVIDIA H200" in title and "HBM 4.3 TB/s" in title and "L2: cold" in title
        assert f"timing: {timing}" in title
    assert "NVIDIA H200" in plots.ceilings_bars(H200).layout.title.text
    with pytest.raises(ValueError, match="columns"):
        plots.latency(df, "nope", ["variant"], "t", H200)


# ---- sweeps ----

def _tiny_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('x = 1\nfail_flag = ""\ncalls = ""\nresults_path = ""\nceilings_path = ""\nrun_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from pathlib import Path\nimport pandas as pd\nfrom kdtree.bench.results import save_table\n"
        "with open(calls, 'a') as f: f.write(f'{x}\\n')\n"
        "if x == 2 and Path(fail_flag).exists(): raise RuntimeError('planted failure')\n"
        "save_table(pd.DataFrame({'kernel': ['k'], 'x': [x], 'median_us': [1.0], 'p20_us': [0.9], 'p80_us': [1.1]}),"
        " results_path, meta={})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_sweep_records_a_failing_point_goes_on_and_resumes(tmp_path):
    (tmp_path / "nb").mkdir()
    (tmp_path / "sweeps").mkdir()
    _tiny_notebook(tmp_path / "nb" / "tiny.ipynb")
    flag, calls = tmp_path / "fail", tmp_path / "calls.txt"
    flag.touch()
    spec = tmp_path / "sweeps" / "tiny.yaml"
    spec.write_text(yaml.safe_dump({"name": "tiny", "notebooks": [
        {"notebook": "nb/tiny.ipynb", "parameters": {"fail_flag": str(flag), "calls": str(calls)},
         "grid": {"x": [1, 2, 3]}}]}))
    run = run_sweep(spec, run_id="r1", profile="cpu", progress=False)
    s = summary(run)
    assert s["counts"] == {"ok": 2, "failed": 1}
    assert sorted(calls.read_text().split()) == ["1", "2", "2", "3"]    # the failing point was retried once
    (pid, err), = s["failures"].items()
    assert "x-2" in pid and "planted failure" in err
    assert (run / f"{pid}.ipynb").exists()                  # the failed notebook is kept for the report
    assert sorted(pd.read_parquet(run / "results.parquet")["x"]) == [1, 3]

    flag.unlink()
    run_sweep(spec, run_id="r1", profile="cpu", progress=False)   # resume: only the failed point runs
    assert summary(run)["counts"] == {"ok": 3}
    assert sorted(calls.read_text().split()) == ["1", "2", "2", "2", "3"]
    assert sorted(pd.read_parquet(run / "results.parquet")["x"]) == [1, 2, 3]
    run_sweep(spec, resume=True, profile="cpu", progress=False)   # --resume finds r1; nothing left to do
    assert len(calls.read_text().split()) == 5


def test_spec_errors_are_clear(tmp_path):
    bad = tmp_path / "s" / "bad.yaml"
    bad.parent.mkdir()
    for text, match in [("notebooks: []", "name"), ("name: x\nnotebooks: []", "non-empty"),
                        ("name: x\nnotebooks: [{notebook: nope.ipynb}]", "does not exist"),
                        ("name: 'a b'\nnotebooks: [{notebook: x}]", "letters")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_spec(bad)


def test_cpu_profile_updates_parameters_and_grid():
    spec = load_spec(ROOT / "parameterized_runs" / "default.yaml")
    gpu, cpu = plan(spec, "gpu"), plan(spec, "cpu")
    assert [p.notebook for p in gpu] == [p.notebook for p in cpu]
    tree_gpu = next(p for p in gpu if "01_tree" in p.notebook).params
    tree_cpu = next(p for p in cpu if "01_tree" in p.notebook).params
    assert max(tree_gpu["budgets"]) == 1024 and max(tree_cpu["budgets"]) < 1024
    assert tree_cpu["depth"] == tree_gpu["depth"]                  # kept from the GPU parameters
    assert len({p.point_id for p in gpu}) == len(gpu)
    with pytest.raises(ValueError, match="profile"):
        plan(spec, "tpu")


# ---- notebooks ----

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_are_generated_clean_and_parameterized(tmp_path):
    gen = runpy.run_path(str(ROOT / "notebooks" / "generate.py"))
    fresh = {p.name: p for p in gen["write_all"](tmp_path)}
    assert sorted(fresh) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        assert path.read_text() == fresh[path.name].read_text(), f"{path.name}: run notebooks/generate.py"
        nb = nbformat.read(str(path), as_version=4)
        assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1
        for stmt in ast.parse(tagged[0].source).body:     # literal defaults only
            assert isinstance(stmt, ast.Assign)
            ast.literal_eval(stmt.value)


def test_ci_sweep_executes_every_notebook_on_cpu():
    run_dir, _ = cpu_run()
    manifest = read_manifest(run_dir)
    assert {Path(e["notebook"]).name for e in manifest["points"].values()} == {
        p.name for p in NOTEBOOKS if not p.name.startswith("99_")}
    assert summary(run_dir)["failures"] == {}
    df, ceilings, _ = load_run(run_dir)
    assert ceilings.kind == "cpu"
    verify = df[df["kernel"] == "verify_attention"]
    assert set(verify["variant"]) == {"torch"} and verify["bound"].notna().all()
    assert (verify["check_rel"] < 1e-2).all()
    build = df[df["kernel"] == "build"]
    assert set(build["variant"]) == {"cpu_paper", "cpu_serving"} and (build["median_us"] > 0).all()
    h = headline(df)
    assert {"verify_attention", "build"} <= set(h["kernel"]) and h["diagnosis (largest point)"].str.len().gt(10).all()


# ---- reports ----

def test_report_pages_have_no_inputs_and_no_remote_assets():
    run_dir, reports = cpu_run()
    index = reports / "ci" / "index.html"
    pages = list((reports / "ci").rglob("*.html"))
    assert index.exists() and len(pages) == len(read_manifest(run_dir)["points"]) + 1
    assert (reports / "plotly.min.js").stat().st_size > 1_000_000
    for page in pages:
        text = page.read_text()
        assert "class=\"jp-CodeMirrorEditor" not in text and "from kdtree.bench import" not in text, \
            f"{page}: input cells rendered"
        assert 'src="http' not in text and "require.js" not in text and "mathjax" not in text.lower()
        assert "plotly.min.js" in text
    assert "Plotly.newPlot" in index.read_text()
    assert 'href="ci/index.html"' in (reports / "local.html").read_text()      # a local run: not in index.html


# ---- wheelhouse ----

def test_wheelhouse_name_parsing(tmp_path):
    assert wheel_project("Jinja2-3.1.4-py3-none-any.whl") == "jinja2"
    assert wheel_project("pyzmq-27.3.0-cp312-abi3-manylinux_2_28_x86_64.whl") == "pyzmq"
    with pytest.raises(ValueError):
        wheel_project("notawheel.tar.gz")
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# comment\nJinja2==3.1.4\ntyping_extensions==4.12\nnumpy @ file:///x\n")
    assert installed_names(freeze) == {"jinja2", "typing-extensions", "numpy"}


def test_cli_reports_a_run_whose_timed_points_all_failed(tmp_path, capsys):
    from kdtree.cli import main

    spec = tmp_path / "partial.yaml"
    spec.write_text(yaml.safe_dump({"name": "partial", "root": str(ROOT), "notebooks": [
        {"notebook": "notebooks/00_device_ceilings.ipynb", "parameters": {"quick": True}},
        {"notebook": "notebooks/02_verify_attention.ipynb",        # 3 heads: rejected by verify_attention
         "parameters": {"q_lens": [5], "prefixes": [8], "batches": [1], "heads": [3], "quick": True}}]}))
    reports = tmp_path / "reports"
    code = main(["sweep", str(spec), "--run-id", "p", "--profile", "cpu", "--report", "--reports", str(reports)])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED 02_verify_attention/" in out and "heads" in out
    assert f"report: {reports / 'p' / 'index.html'}" in out
    text = (reports / "p" / "index.html").read_text()
    assert "<b>failed</b>" in text and "no point with a FLOP model" in text
    assert len(list((reports / "p" / "02_verify_attention").glob("*.html"))) == 1   # the failed page
    assert main(["compare", str(tmp_path / "p"), str(tmp_path / "p"), "--reports", str(reports)]) == 2
    err = capsys.readouterr().err   # a user error: one line, no traceback
    assert err.startswith("kdtree: error: ") and "no timed results" in err and err.count("\n") == 1

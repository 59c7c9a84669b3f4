"""Sweeps on dask.distributed, on CPU: the local executor and a two-worker LocalCluster give the
same run folder; a worker killed mid-sweep loses no finished point and the run completes on
resume; bad executor arguments fail clearly. Every test is bounded by a SIGALRM deadline."""
from __future__ import annotations

import datetime as _dt
import signal
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from kdtree.bench import sweep
from kdtree.bench.sweep import read_manifest, run_sweep, summary
from workbook_run import ROOT

distributed = pytest.importorskip("distributed")

CELL_TIMEOUT = 60          # seconds per notebook cell
DEADLINE = 100             # seconds per test


@pytest.fixture(autouse=True)
def deadline():
    """Fail a test that hangs (a cluster that never starts, a point that never returns)."""
    def expire(*_):
        raise TimeoutError(f"test ran past its {DEADLINE} s deadline")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(DEADLINE)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def two_workers():
    """A LocalCluster of two single-threaded worker processes; a killed worker's task fails at
    once (no silent reruns), and a worker holds one task at a time."""
    import dask

    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", scheduler_kwargs={"allowed_failures": 0},
                                           silence_logs=40)
    with cluster:
        yield cluster


def _files(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


def _cheap_notebook(path: Path) -> None:
    """Point x appends x to ``calls`` and saves a one-row table (no torch import: fast). With
    ``kill_flag`` present, point 3 deletes it and kills its worker process (the kernel's parent)
    in the middle of its execution."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('x = 1\nkill_flag = ""\ncalls = ""\nresults_path = ""\nceilings_path = ""\n'
                                       'run_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import os, signal, time\nfrom pathlib import Path\nimport pandas as pd\n"
        "with open(calls, 'a') as f: f.write(f'{x}\\n')\n"
        "if x == 3 and kill_flag and Path(kill_flag).exists():\n"
        "    Path(kill_flag).unlink()\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "    time.sleep(30)\n"
        "Path(results_path).parent.mkdir(parents=True, exist_ok=True)\n"
        "pd.DataFrame({'x': [x]}).to_parquet(results_path + '.parquet')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def _sweep_file(tmp_path: Path, entries: list[dict]) -> Path:
    (tmp_path / "nb").mkdir()
    _cheap_notebook(tmp_path / "nb" / "cheap.ipynb")
    spec = tmp_path / "sweeps" / "small.yaml"
    spec.parent.mkdir()
    spec.write_text(yaml.safe_dump({"name": "small", "notebooks": entries}))
    return spec


def test_local_and_two_worker_cluster_give_the_same_run_folder(tmp_path, two_workers):
    calls = tmp_path / "calls.txt"
    spec = _sweep_file(tmp_path, [
        {"notebook": str(ROOT / "notebooks" / "00_device_ceilings.ipynb"), "parameters": {"quick": True}},
        {"notebook": "nb/cheap.ipynb", "parameters": {"calls": str(calls)}, "grid": {"x": [1, 2, 3]}}])
    runs = {ex: run_sweep(spec, run_id=ex, profile="cpu", progress=False, timeout=CELL_TIMEOUT, executor=ex,
                          scheduler=two_workers.scheduler_address if ex == "dask" else None)
            for ex in ("local", "dask")}
    local, dask = (read_manifest(runs[ex]) for ex in ("local", "dask"))
    assert summary(runs["local"])["counts"] == summary(runs["dask"])["counts"] == {"ok": 4}
    assert local["points"].keys() == dask["points"].keys()
    assert _files(runs["local"]) == _files(runs["dask"])
    assert {"run.json", "sweep.yaml", "ceilings.json", "results.parquet"} <= _files(runs["dask"])
    assert local["executor"] == "local" and dask["executor"] == f"dask {two_workers.scheduler_address}"
    assert sorted(calls.read_text().split()) == ["1", "1", "2", "2", "3", "3"]       # each point ran once
    # the first notebook's points (the run's ceilings) finished before the others started
    entries = list(dask["points"].values())
    done = _dt.datetime.fromisoformat(entries[0]["started"]) + _dt.timedelta(seconds=entries[0]["seconds"])
    assert all(_dt.datetime.fromisoformat(e["started"]) >= done - _dt.timedelta(seconds=1) for e in entries[1:])
    assert len({e["worker"] for e in local["points"].values()}) == 1
    assert {e["worker"] for e in entries} <= set(two_workers.scheduler_info["workers"])
    tables = [pd.read_parquet(runs[ex] / "results.parquet") for ex in ("local", "dask")]
    assert sorted(tables[0]["point"].unique()) == sorted(tables[1]["point"].unique())


def test_a_killed_worker_loses_no_finished_point_and_resume_completes(tmp_path, two_workers):
    flag, calls = tmp_path / "kill", tmp_path / "calls.txt"
    flag.touch()
    spec = _sweep_file(tmp_path, [{"notebook": "nb/cheap.ipynb", "parameters": {"kill_flag": str(flag),
                                                                              "calls": str(calls)},
                                   "grid": {"x": [1, 2, 3, 4]}}])
    kw = dict(run_id="k", profile="cpu", progress=False, timeout=CELL_TIMEOUT, executor="dask",
              scheduler=two_workers.scheduler_address)
    run = run_sweep(spec, **kw)
    s = summary(run)
    assert not flag.exists() and s["counts"] == {"ok": 3, "failed": 1}
    (pid, err), = s["failures"].items()
    assert "x-3" in pid and "KilledWorker" in err
    finished = {p: e for p, e in read_manifest(run)["points"].items() if e["status"] == "ok"}
    assert all((run / e["output"]).exists() and (run / e["results"]).exists() for e in finished.values())
    assert sorted(pd.read_parquet(run / "results.parquet")["x"]) == [1, 2, 4]
    assert sorted(calls.read_text().split()) == ["1", "2", "3", "4"]   # no finished point was recomputed

    run_sweep(spec, **kw)                                   # resume: only the killed point runs again
    assert summary(run)["counts"] == {"ok": 4}
    assert sorted(calls.read_text().split()) == ["1", "2", "3", "3", "4"]
    assert {p: e for p, e in read_manifest(run)["points"].items() if p in finished} == finished
    assert sorted(pd.read_parquet(run / "results.parquet")["x"]) == [1, 2, 3, 4]


def test_bad_executor_arguments_name_the_argument(tmp_path, monkeypatch):
    spec = ROOT / "parameterized_runs" / "ci_cpu.yaml"
    with pytest.raises(ValueError, match="executor: expected one of local, dask, got 'slurm'"):
        run_sweep(spec, executor="slurm", out_root=tmp_path)
    with pytest.raises(ValueError, match="scheduler: .* needs executor='dask'"):
        run_sweep(spec, executor="local", scheduler="tcp://127.0.0.1:8786", out_root=tmp_path)
    with pytest.raises(ValueError, match="scheduler: expected an address"):
        run_sweep(spec, executor="dask", scheduler="no address", out_root=tmp_path)
    monkeypatch.setattr(sweep, "CONNECT_TIMEOUT", 1.0)
    with pytest.raises(ConnectionError, match="scheduler 'tcp://127.0.0.1:9': no Dask scheduler answered"):
        run_sweep(spec, executor="dask", scheduler="tcp://127.0.0.1:9", run_id="x", out_root=tmp_path)
    assert not (tmp_path / "x").exists()                    # nothing written before the cluster answered


def test_cli_passes_the_executor_and_reports_an_interrupted_sweep(monkeypatch, capsys):
    from kdtree.cli import build_parser, main

    args = build_parser().parse_args(["sweep", "s.yaml", "--executor", "dask", "--scheduler", "tcp://h:8786"])
    assert (args.executor, args.scheduler) == ("dask", "tcp://h:8786")
    assert build_parser().parse_args(["sweep", "s.yaml"]).executor == "local"
    assert main(["sweep", "s.yaml", "--executor", "slurm"]) == 2        # a user error: one line, status 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "kdtree: error: argument --executor: invalid choice: 'slurm' (choose from 'local', 'dask') "
        "(see kdtree sweep --help)"]

    seen = {}

    def interrupted(spec, **kw):
        seen.update(kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_sweep", interrupted)
    assert main(["sweep", "s.yaml", "--executor", "dask", "--scheduler", "tcp://h:8786"]) == 130
    assert (seen["executor"], seen["scheduler"]) == ("dask", "tcp://h:8786")
    assert "finished points are kept" in capsys.readouterr().err


def test_local_executor_pins_one_worker_per_visible_gpu(monkeypatch):
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    with sweep.sweep_client("local") as client:
        pins = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))     # read in each worker
        threads = client.nthreads()
    assert sorted(pins.values()) == ["2", "5"] and set(threads.values()) == {1}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")        # CUDA's "no GPU": one unpinned worker
    assert sweep.visible_gpus() == []


def test_twin_runs_every_point_in_both_runs_back_to_back_and_resumes_each(tmp_path, capsys, caplog):
    from kdtree.bench.run_folder import latest_run
    from kdtree.cli import main

    calls = tmp_path / "calls.txt"
    spec = _sweep_file(tmp_path, [{"notebook": "nb/first.ipynb", "parameters": {"calls": str(calls), "x": 0}},
                                  {"notebook": "nb/cheap.ipynb", "parameters": {"calls": str(calls)},
                                   "grid": {"x": [1, 2, 3]}}])
    _cheap_notebook(tmp_path / "nb" / "first.ipynb")
    assert main(["sweep", str(spec), "--run-id", "t", "--twin", "--profile", "cpu", "--timeout", str(CELL_TIMEOUT)]) == 0
    out = capsys.readouterr().out
    a, b = spec.parent / "t", spec.parent / "t-twin"
    assert f"run t in {a}: {{'ok': 4}}" in out and f"run t-twin in {b}: {{'ok': 4}}" in out
    assert f"kdtree compare {a} {b}" in out
    ma, mb = read_manifest(a), read_manifest(b)
    assert (ma["twin"], mb["twin"]) == ("t-twin", "t") and ma["points"].keys() == mb["points"].keys()
    assert _files(a) == _files(b)
    # each point ran in the run, then at once in its twin; the first notebook's points came first
    assert calls.read_text().split() == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert latest_run(spec.parent) == a                     # the pair resumes through its first run

    damaged = next(e for e in mb["points"].values() if e["params"].get("x") == 2)
    (b / damaged["results"]).unlink()
    run_sweep(spec, resume=True, twin=True, profile="cpu", progress=False, timeout=CELL_TIMEOUT)
    assert calls.read_text().split()[8:] == ["2"]           # only the twin's damaged point ran again
    assert summary(a)["counts"] == summary(b)["counts"] == {"ok": 4}
    assert "run t-twin: point" in caplog.text

    with pytest.raises(ValueError, match="with twin, name the first run"):
        run_sweep(spec, run_id="t-twin", twin=True, profile="cpu", progress=False)

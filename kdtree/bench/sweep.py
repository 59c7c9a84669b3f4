"""Sweeps: execute parameterized notebooks with papermill over the grids of a YAML file.

A sweep file under ``parameterized_runs/`` looks like::

    name: default
    notebooks:
      - notebook: notebooks/01_tree_build.ipynb
        label: scaling                                             # optional, names the points
        parameters: {budgets: [16, 64, 256, 1024], quick: false}   # fixed, passed as is
        grid: {batch: [1, 8, 64]}                                  # one point per combination
        cpu: {parameters: {budgets: [16, 64], quick: true}, grid: {batch: [1]}}

Paths are relative to the repository root (``root:``, default the parent of the file's
folder). The ``cpu`` block updates ``parameters`` and ``grid`` when the run has no GPU, so one
file runs GPU sizes on a GPU and small sizes in CI. Every point also gets ``results_path``
(where it saves its table), ``ceilings_path`` (the run's ceilings, measured once) and
``run_dir``.

A run lives in ``parameterized_runs/<run-id>/``: ``run.json`` (the plan, each point's status,
time and error), one executed notebook and one results table per point, and ``results.parquet``
combining every table. A failing point is recorded and the sweep goes on; running again with
the same run id skips the points that finished and retries the rest.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
import os
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from kdtree.bench.results import load_table, run_metadata, save_table

MANIFEST = "run.json"
RESULTS = "results"


@dataclass(frozen=True)
class Point:
    """One notebook execution of a sweep."""

    point_id: str
    notebook: str          # path relative to the root
    params: dict           # parameters passed to papermill (run paths excluded)


def load_spec(path: str | Path) -> dict:
    """Read and check a sweep file; returns the spec with ``root`` resolved to a Path.

    Raises
    ------
    ValueError
        When the file lacks ``name`` or ``notebooks``, or an entry is malformed.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"sweep file {path} does not exist")
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"{path}: a sweep file needs a string 'name'")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", spec["name"]):
        raise ValueError(f"{path}: name {spec['name']!r} may use letters, digits, '.', '_' and '-' only")
    entries = spec.get("notebooks")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: 'notebooks' must be a non-empty list")
    root = (path.parent / spec.get("root", "..")).resolve()
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "notebook" not in e:
            raise ValueError(f"{path}: notebooks[{i}] needs a 'notebook' path")
        unknown = set(e) - {"notebook", "label", "parameters", "grid", "cpu"}
        if unknown:
            raise ValueError(f"{path}: notebooks[{i}] has unknown keys {sorted(unknown)}")
        if not (root / e["notebook"]).exists():
            raise ValueError(f"{path}: notebooks[{i}]: {root / e['notebook']} does not exist")
        for key in ("parameters", "grid"):
            for block in (e, e.get("cpu") or {}):
                if not isinstance(block.get(key, {}), dict):
                    raise ValueError(f"{path}: notebooks[{i}].{key} must be a mapping")
        for k, v in {**e.get("grid", {}), **(e.get("cpu") or {}).get("grid", {})}.items():
            if not isinstance(v, list) or not v:
                raise ValueError(f"{path}: notebooks[{i}].grid.{k} must be a non-empty list")
    spec["root"] = root
    spec["path"] = path.resolve()
    return spec


def _point_id(label: str, varying: dict, params: dict) -> str:
    """Readable and stable: the label and the varying values, then a hash of all parameters."""
    slug = "_".join([label] * bool(label) + [f"{k}-{'.'.join(map(str, v)) if isinstance(v, list) else v}"
                                             for k, v in varying.items()])
    slug = re.sub(r"[^A-Za-z0-9._-]", "", slug)[:60] or "point"
    digest = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:6]
    return f"{slug}-{digest}"


def plan(spec: dict, profile: str) -> list[Point]:
    """Expand a spec into its points for ``profile`` (``gpu`` or ``cpu``), in file order."""
    if profile not in ("gpu", "cpu"):
        raise ValueError(f"profile: expected 'gpu' or 'cpu', got {profile!r}")
    points = []
    for e in spec["notebooks"]:
        fixed, grid = dict(e.get("parameters") or {}), dict(e.get("grid") or {})
        if profile == "cpu" and e.get("cpu"):
            fixed.update(e["cpu"].get("parameters") or {})
            grid.update(e["cpu"].get("grid") or {})
        for combo in itertools.product(*grid.values()):
            varying = dict(zip(grid, combo))
            params = {**fixed, **varying}
            pid = f"{Path(e['notebook']).stem}/{_point_id(e.get('label', ''), varying, params)}"
            if any(p.point_id == pid for p in points):
                raise ValueError(f"{spec['path']}: two points of {e['notebook']} have the same parameters")
            points.append(Point(pid, e["notebook"], params))
    return points


def default_profile() -> str:
    """``gpu`` when torch sees a CUDA device, else ``cpu``."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def _device_slug(profile: str) -> str:
    if profile == "cpu":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def _read_manifest(run_dir: Path) -> dict | None:
    f = run_dir / MANIFEST
    return json.loads(f.read_text()) if f.exists() else None


def _write_manifest(run_dir: Path, manifest: dict) -> None:
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    tmp.replace(run_dir / MANIFEST)


def latest_run(out_root: str | Path, name: str | None = None) -> Path | None:
    """The most recently created run directory (of sweep ``name``, if given) under ``out_root``."""
    runs = {}
    for d in Path(out_root).glob("*"):
        m = _read_manifest(d) if d.is_dir() else None
        if m and (name is None or m.get("sweep") == name):
            runs[d] = m.get("created", "")
    return max(runs, key=runs.get) if runs else None


def _execute(point: Point, spec: dict, run_dir: Path, kernel_name: str, timeout: float | None) -> dict:
    """Run one point with papermill; returns its manifest entry (status ok or failed)."""
    import papermill as pm

    root = spec["root"]
    rel = run_dir.relative_to(root) if run_dir.is_relative_to(root) else run_dir
    out_nb = run_dir / f"{point.point_id}.ipynb"
    out_nb.parent.mkdir(parents=True, exist_ok=True)
    results = rel / RESULTS / point.point_id
    params = {**point.params, "results_path": str(results), "ceilings_path": str(rel / "ceilings.json"),
              "run_dir": str(rel)}
    entry = {"notebook": point.notebook, "params": point.params, "output": str(out_nb.relative_to(run_dir)),
             "results": str(Path(RESULTS) / point.point_id) + ".parquet",
             "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    t0 = time.perf_counter()
    try:
        pm.execute_notebook(str(root / point.notebook), str(out_nb), parameters=params, cwd=str(root),
                            kernel_name=kernel_name, progress_bar=False, log_output=False,
                            execution_timeout=timeout)
        if not (run_dir / entry["results"]).exists():
            raise RuntimeError(f"notebook ran but wrote no results at {results}.parquet")
        entry.update(status="ok", error=None)
    except Exception as exc:  # a failing point is recorded, the sweep goes on
        name = getattr(exc, "ename", type(exc).__name__)
        value = getattr(exc, "evalue", str(exc))
        entry.update(status="failed", error=f"{name}: {value}".strip()[:2000],
                     traceback=traceback.format_exc(limit=3)[-2000:])
    entry["seconds"] = round(time.perf_counter() - t0, 2)
    return entry


def combine_results(run_dir: str | Path) -> pd.DataFrame:
    """Concatenate the tables of every finished point (columns ``notebook`` and ``point`` added)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    frames = []
    for pid, e in manifest["points"].items():
        if e.get("status") == "ok" and (run_dir / e["results"]).exists():
            frames.append(load_table(run_dir / e["results"]).assign(notebook=Path(e["notebook"]).stem, point=pid))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_sweep(spec_path: str | Path, *, run_id: str | None = None, resume: bool = False,
              profile: str = "auto", out_root: str | Path | None = None, kernel_name: str = "python3",
              timeout: float | None = None, progress: bool = True) -> Path:
    """Execute a sweep file; returns the run directory.

    Parameters
    ----------
    spec_path : path
        The YAML sweep file.
    run_id : str, optional
        Name of the run directory; an existing run of that id is resumed. Default
        ``<name>-<device>-<UTC date-time>``.
    resume : bool
        Without ``run_id``: resume the latest run of this sweep instead of starting a new one.
    profile : {"auto", "gpu", "cpu"}
        Which sizes to run; ``auto`` picks ``gpu`` when torch sees one.
    out_root : path, optional
        Where run directories go; default the sweep file's folder.
    kernel_name : str
        Jupyter kernel that executes the notebooks.
    timeout : float, optional
        Per-cell timeout in seconds.
    progress : bool
        Show a progress bar over the points.
    """
    from tqdm.auto import tqdm

    spec = load_spec(spec_path)
    profile = default_profile() if profile == "auto" else profile
    points = plan(spec, profile)
    out_root = Path(out_root) if out_root else spec["path"].parent
    if run_id is None and resume:
        found = latest_run(out_root, spec["name"])
        if found is None:
            raise ValueError(f"--resume: no earlier run of sweep {spec['name']!r} under {out_root}")
        run_id = found.name
    if run_id is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        run_id = f"{spec['name']}-{_device_slug(profile)}-{stamp}"
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run_id):
        raise ValueError(f"run_id {run_id!r}: use letters, digits, '.', '_' and '-' only")
    run_dir = out_root / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    old = _read_manifest(run_dir) or {}
    manifest = {"run_id": run_id, "sweep": spec["name"], "spec_path": str(spec["path"]), "profile": profile,
                "created": old.get("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")),
                "metadata": run_metadata(),
                "points": {p.point_id: {"notebook": p.notebook, "params": p.params, "status": "pending"}
                           for p in points}}
    for pid, e in (old.get("points") or {}).items():
        if pid in manifest["points"] and e.get("status") == "ok" and (run_dir / e["output"]).exists():
            manifest["points"][pid] = e
    (run_dir / "sweep.yaml").write_text(spec["path"].read_text())
    _write_manifest(run_dir, manifest)

    pkg_root = str(Path(__file__).resolve().parents[2])
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pkg_root + (os.pathsep + env_before if env_before else "")
    todo = [p for p in points if manifest["points"][p.point_id]["status"] != "ok"]
    bar = tqdm(todo, desc=f"sweep {run_id}", unit="point", disable=not progress)
    try:
        for p in bar:
            bar.set_postfix_str(p.point_id[:50])
            manifest["points"][p.point_id] = _execute(p, spec, run_dir, kernel_name, timeout)
            _write_manifest(run_dir, manifest)
    except KeyboardInterrupt:
        manifest["points"][p.point_id]["status"] = "interrupted"
        _write_manifest(run_dir, manifest)
        raise
    finally:
        bar.close()
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before
    combined = combine_results(run_dir)
    if not combined.empty:
        save_table(combined, run_dir / "results", meta=manifest["metadata"])
    return run_dir


def summary(run_dir: str | Path) -> dict:
    """Counts of ok / failed / pending points and the failures (point id -> error)."""
    manifest = read_manifest(run_dir)
    status = pd.Series({pid: e.get("status", "pending") for pid, e in manifest["points"].items()})
    return {"run_id": manifest["run_id"], "counts": status.value_counts().to_dict(),
            "failures": {pid: e.get("error") for pid, e in manifest["points"].items()
                         if e.get("status") in ("failed", "interrupted")}}


def read_manifest(run_dir: str | Path) -> dict:
    """The ``run.json`` of a run directory."""
    manifest = _read_manifest(Path(run_dir))
    if manifest is None:
        raise ValueError(f"{run_dir} is not a sweep run (no {MANIFEST})")
    return manifest

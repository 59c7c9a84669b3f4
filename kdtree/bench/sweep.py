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
time, error and the files it wrote, with sizes and checksums), one executed notebook and one
results table per point, and ``results.parquet`` combining every table. Every file is written
under a unique temporary name and renamed into place, so a killed sweep leaves whole files or
none. A failing point is retried once, then recorded, and the sweep goes on; running again with
the same run id re-checks every finished point and runs again each one whose files are missing,
truncated or changed (saying which and why), and the points that failed or never ran. One sweep
writes a run at a time (``run.lock``; see :mod:`kdtree.bench.run_folder`), and the sweep file is
checked whole before anything runs (:mod:`kdtree.bench.sweep_spec`).

Points run on dask.distributed workers, which do placement, retries and progress:

* ``executor="local"``: a cluster of this machine, one single-threaded worker process per
  visible GPU, each pinned to its GPU with ``CUDA_VISIBLE_DEVICES`` (one worker without a GPU).
* ``executor="dask"``: the cluster of ``scheduler`` (``tcp://host:port``), else a
  ``dask_cuda.LocalCUDACluster`` where dask-cuda is installed and a GPU is visible, else the
  local executor's cluster. Workers of a remote cluster must import kdtree and see the
  repository and the run folder at the same paths as this process (a shared file system).

The points of the first notebook of the file run before the others are handed out (the
default sweep measures the run's ceilings there). Each point's notebook and table are written
by its worker, and ``run.json`` is updated as each point completes, so an interrupted run
loses no finished point.

``twin=True`` writes two complete runs of the sweep in one invocation, ``<run-id>`` and
``<run-id>-twin``, each point run in the first and at once in the second: ``kdtree compare`` of
the two then measures how well the workbook repeats itself, point by point, seconds apart.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import itertools
import json
import logging
import os
import re
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kdtree.bench.atomic import atomic_path, write_text
from kdtree.bench.notebook_run import execute_notebook
from kdtree.bench.results import load_table, run_metadata, save_table
from kdtree.bench.run_folder import (LOCK, MANIFEST, TWIN, DamagedRun, damage, file_record, latest_run, load_manifest, log,
                                     point_files, run_lock, write_manifest)
from kdtree.bench.sweep_spec import load_spec

__all__ = ["MANIFEST", "TWIN", "DamagedRun", "Point", "PointFailed", "combine_results", "latest_run", "load_spec",
           "plan", "read_manifest", "run_sweep", "summary"]

RESULTS = "results"
CEILINGS = "ceilings.json"
EXECUTORS = ("local", "dask")
CONNECT_TIMEOUT = 20.0     # seconds to wait for a Dask scheduler given by address
# Preloaded by the local cluster's worker processes: Ctrl-C reaches the whole process group, and
# the sweep (not each worker, with a traceback) records the interrupted points and stops them.
IGNORE_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"


@dataclass(frozen=True)
class Point:
    """One notebook execution of a sweep."""

    point_id: str
    notebook: str          # path relative to the root
    params: dict           # parameters passed to papermill (run paths excluded)


class PointFailed(Exception):
    """A point's notebook raised or wrote no results; ``entry`` is its manifest entry.

    Raised on the worker so that dask.distributed retries the point; the client records
    ``entry`` once the retries are spent.
    """

    def __init__(self, entry: dict):
        super().__init__(entry)
        self.entry = entry

    def __str__(self) -> str:
        return str(self.entry.get("error"))


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


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _portable(notebook: Path, source: str, output: str) -> None:
    """Replace the absolute paths papermill records in an executed notebook's metadata by
    paths relative to the sweep's root (``source``, ``output``): a run folder names no machine."""
    if not notebook.exists():
        return
    nb = json.loads(notebook.read_text())
    meta = nb.get("metadata", {}).get("papermill")
    if isinstance(meta, dict):
        meta.update(input_path=source, output_path=output)
        notebook.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def _execute(point: Point, spec: dict, run_dir: Path, kernel_name: str, timeout: float | None) -> dict:
    """Run one point with papermill, on a worker; returns its manifest entry (status ok).

    The entry names where it ran (``host``, ``gpu``: the worker's ``CUDA_VISIBLE_DEVICES``,
    ``worker``: the dask worker's address) and records ``files``: the notebook, the results
    table and, when this point wrote them, the run's ceilings (see :mod:`kdtree.bench.run_folder`).
    The notebook is written under a temporary name and renamed into place.

    Raises
    ------
    PointFailed
        When the notebook raised or wrote no readable results; carries the entry (status failed).
    """
    from distributed import get_worker

    pkg_root = str(Path(__file__).resolve().parents[2])     # the notebook kernel imports this kdtree
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([pkg_root, *paths])
    root = spec["root"]
    rel = run_dir.relative_to(root) if run_dir.is_relative_to(root) else run_dir
    out_nb = run_dir / f"{point.point_id}.ipynb"
    results = rel / RESULTS / point.point_id
    params = {**point.params, "results_path": str(results), "ceilings_path": str(rel / CEILINGS),
              "run_dir": str(rel)}
    try:
        worker = get_worker().address
    except ValueError:                                      # called outside a dask worker
        worker = None
    entry = {"notebook": point.notebook, "params": point.params, "output": str(out_nb.relative_to(run_dir)),
             "results": str(Path(RESULTS) / point.point_id) + ".parquet",
             "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             "host": socket.gethostname(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "worker": worker}
    ceilings_before = _sha(run_dir / CEILINGS)
    t0 = time.perf_counter()
    try:
        with atomic_path(out_nb, keep_on_error=True) as tmp_nb:
            try:
                execute_notebook(str(root / point.notebook), str(tmp_nb), params, cwd=str(root),
                                 kernel_name=kernel_name, timeout=timeout, label=point.point_id)
            finally:
                _portable(tmp_nb, point.notebook, str(rel / out_nb.relative_to(run_dir)))
        if not (run_dir / entry["results"]).exists():
            raise RuntimeError(f"notebook ran but wrote no results at {results}.parquet")
        files = {name: file_record(run_dir / name) for name in point_files(run_dir, entry)}
        if _sha(run_dir / CEILINGS) not in (None, ceilings_before):
            files[CEILINGS] = file_record(run_dir / CEILINGS)
        entry.update(status="ok", error=None, files=files)
    except Exception as exc:  # recorded in the entry; the client records it once retries are spent
        name = getattr(exc, "ename", type(exc).__name__)
        value = getattr(exc, "evalue", str(exc))
        entry.update(status="failed", error=f"{name}: {value}".strip()[:2000],
                     traceback=traceback.format_exc(limit=3)[-2000:])
        with contextlib.suppress(ValueError, OSError):      # the failed notebook, kept for the report
            entry["files"] = {entry["output"]: file_record(out_nb)}
    entry["seconds"] = round(time.perf_counter() - t0, 2)
    if entry["status"] == "failed":
        raise PointFailed(entry)
    return entry


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else torch's count."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:                                     # CUDA stops at "-1"
        ids = [d.strip() for d in env.split(",") if d.strip()]
        return list(itertools.takewhile(lambda d: d != "-1", ids))
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def local_cluster():
    """A cluster of this machine: one single-threaded worker process per visible GPU, pinned to
    it with ``CUDA_VISIBLE_DEVICES`` (one unpinned worker without a GPU)."""
    from distributed import Nanny, Scheduler, SpecCluster

    def worker(env: dict) -> dict:
        return {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": 0, "env": env, "dashboard": False,
                                          "silence_logs": logging.ERROR, "preload": [IGNORE_SIGINT]}}

    gpus = visible_gpus()
    workers = {f"gpu{d}": worker({"CUDA_VISIBLE_DEVICES": d}) for d in gpus} or {"cpu": worker({})}
    return SpecCluster(workers=workers, silence_logs=logging.ERROR,
                       scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False,
                                                                   "dashboard_address": ":0"}})


@contextlib.contextmanager
def sweep_client(executor: str = "local", scheduler: str | None = None):
    """A dask.distributed client for ``executor`` (see the module docstring); closes what it started.

    Raises
    ------
    ValueError
        For an unknown ``executor``, or a ``scheduler`` with ``executor="local"``.
    ConnectionError
        When no scheduler answers at ``scheduler`` within :data:`CONNECT_TIMEOUT` seconds.
    """
    from distributed import Client

    check_executor(executor, scheduler)
    if scheduler:
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConnectionError(f"scheduler {scheduler!r}: no Dask scheduler answered within "
                                  f"{CONNECT_TIMEOUT:g} s ({exc})") from exc
        with client:
            yield client
        return
    cluster = None
    if executor == "dask" and visible_gpus():
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            pass
        else:
            cluster = LocalCUDACluster(threads_per_worker=1, silence_logs=logging.ERROR)
    with cluster or local_cluster() as cluster, Client(cluster) as client:
        yield client


def check_executor(executor: str, scheduler: str | None = None) -> None:
    """Raise ``ValueError`` unless ``executor`` and ``scheduler`` make sense together."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")
    if scheduler is not None and executor != "dask":
        raise ValueError(f"scheduler: {scheduler!r} needs executor='dask', got executor={executor!r}")
    if scheduler is not None and not (isinstance(scheduler, str) and re.fullmatch(r"(\w+://)?[^/\s]+:\d+", scheduler)):
        raise ValueError(f"scheduler: expected an address like tcp://host:8786, got {scheduler!r}")


@dataclass
class _Run:
    """A run folder being written: its directory, its manifest, whether this sweep created it."""

    dir: Path
    manifest: dict
    fresh: bool


def _run_points(client, jobs: list[tuple[Point, _Run]], spec: dict, bar, kernel_name: str,
                timeout: float | None) -> None:
    """Submit ``jobs`` (retried once by dask), in their order where workers are fewer than jobs,
    and record each in its run as it completes."""
    from distributed import as_completed

    futures = {client.submit(_execute, p, spec, run.dir, kernel_name, timeout, retries=1, priority=len(jobs) - i,
                             key=f"kdtree-point-{p.point_id}-{os.urandom(4).hex()}"): (p, run)
               for i, (p, run) in enumerate(jobs)}
    try:
        for fut in as_completed(futures):
            p, run = futures.pop(fut)
            points = run.manifest["points"]
            try:
                entry = fut.result()
            except PointFailed as exc:
                entry = exc.entry
            except Exception as exc:  # the point never finished: its worker died (KilledWorker) or it was lost
                entry = {**points[p.point_id], "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
            if CEILINGS in entry.get("files", {}):          # the run's ceilings are this point's now
                for other in points.values():
                    other.get("files", {}).pop(CEILINGS, None)
            points[p.point_id] = entry
            write_manifest(run.dir, run.manifest)
            fut.cancel()            # recorded: the cluster forgets it (a lost worker's results are not recomputed)
            bar.set_postfix_str(p.point_id[:50])
            bar.update()
    except KeyboardInterrupt:
        for p, run in futures.values():                     # submitted, not recorded
            run.manifest["points"][p.point_id]["status"] = "interrupted"
        for run in {id(r): r for _, r in futures.values()}.values():
            write_manifest(run.dir, run.manifest)
        with contextlib.suppress(Exception):                # best effort: the cluster closes next anyway
            client.cancel(list(futures), force=True)
        raise


def combine_results(run_dir: str | Path) -> pd.DataFrame:
    """Concatenate the tables of every finished point (columns ``notebook`` and ``point`` added),
    each point once. A damaged point (see :func:`read_manifest`) is left out with a warning that
    names it; ``df.attrs["damaged"]`` maps each one to the reason."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    frames, damaged = [], {}
    for pid, e in manifest["points"].items():
        if e.get("status") == "damaged":
            damaged[pid] = e["error"]
        elif e.get("status") == "ok":
            try:
                frames.append(load_table(run_dir / e["results"]).assign(notebook=Path(e["notebook"]).stem,
                                                                       point=pid))
            except ValueError as exc:
                damaged[pid] = str(exc)
    for pid, why in damaged.items():
        log.warning("run %s: point %s left out: %s", manifest["run_id"], pid, why)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    df.attrs["damaged"] = damaged
    return df


def _whole_points(run_dir: Path, manifest: dict) -> None:
    """Carry over into ``manifest`` the finished points of the run's earlier ``run.json`` whose
    files are whole; warn, one line each, about the ones that run again and why."""
    try:
        old = load_manifest(run_dir)
    except DamagedRun as exc:
        log.warning("%s: no point can be checked, every point runs again", exc)
        old = {}
    if old is None:
        if any(f.name not in (LOCK, "sweep.yaml") for f in run_dir.iterdir()):
            log.warning("%s: no %s, so no point can be checked: every point runs again", run_dir, MANIFEST)
        old = {}
    manifest["created"] = old.get("created", manifest["created"])
    for pid, e in (old.get("points") or {}).items():
        if pid not in manifest["points"] or e.get("status") != "ok":
            continue
        why = damage(run_dir, e)
        if why:
            log.warning("run %s: point %s runs again: %s", manifest["run_id"], pid, why)
        else:
            manifest["points"][pid] = e


def _save_combined(run_dir: Path, manifest: dict) -> None:
    """Write ``results.parquet`` (every whole point once) and record it in the manifest; remove
    it when no point finished."""
    combined = combine_results(run_dir)
    names = [f"{RESULTS}{ext}" for ext in (".parquet", ".csv", ".meta.json")]
    if combined.empty:
        for name in names:
            (run_dir / name).unlink(missing_ok=True)
        manifest.pop("combined", None)
    else:
        save_table(combined, run_dir / RESULTS, meta=manifest["metadata"])
        manifest["combined"] = {name: file_record(run_dir / name) for name in names}
    write_manifest(run_dir, manifest)


def run_sweep(spec_path: str | Path, *, run_id: str | None = None, resume: bool = False,
              profile: str = "auto", out_root: str | Path | None = None, kernel_name: str = "python3",
              timeout: float | None = None, progress: bool = True, executor: str = "local",
              scheduler: str | None = None, twin: bool = False) -> Path:
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
    executor : {"local", "dask"}
        Where the points run (see the module docstring); the run folder is the same either way.
    scheduler : str, optional
        With ``executor="dask"``: the address of a running Dask scheduler, ``tcp://host:port``.
    twin : bool
        Also write a second, complete run of the same sweep, ``<run_id>-twin`` (:data:`TWIN`), point
        by point with the first: each point runs in the run, then at once in the twin (on one
        worker; the first notebook's points of both runs come first, as in a single run). The two
        then compare point for point (``kdtree compare``) with the twins of a point seconds apart,
        so the comparison shows the instrument's repeatability rather than the host's drift over
        the minutes a whole run takes. Each run folder resumes on its own, or both with ``twin``.

    Raises
    ------
    ValueError
        For a bad sweep file, run id, executor or scheduler address.
    ConnectionError
        When no scheduler answers at ``scheduler``.
    """
    from tqdm.auto import tqdm

    check_executor(executor, scheduler)
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
    if twin and run_id.endswith(TWIN):
        raise ValueError(f"run_id {run_id!r}: with twin, name the first run; its twin is {run_id}{TWIN}")
    root = spec["root"]
    ids = [run_id, run_id + TWIN] if twin else [run_id]
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    runs = []
    for rid in ids:
        run_dir = out_root / rid
        manifest = {"run_id": rid, "sweep": spec["name"],
                    "spec_path": os.path.relpath(spec["path"], root),      # relative: no machine paths
                    "root": os.path.relpath(root, run_dir.resolve()), "profile": profile, "created": created,
                    "executor": executor if scheduler is None else f"dask {scheduler}", "metadata": run_metadata(),
                    "points": {p.point_id: {"notebook": p.notebook, "params": p.params, "status": "pending"}
                               for p in points}}
        if twin:
            manifest["twin"] = ids[1 - ids.index(rid)]
        runs.append(_Run(run_dir, manifest, fresh=not run_dir.exists()))
    first = spec["notebooks"][0]["notebook"]        # runs first: the default sweep measures ceilings there

    try:
        with contextlib.ExitStack() as held:
            for run in runs:
                run.dir.mkdir(parents=True, exist_ok=True)
                held.enter_context(run_lock(run.dir))   # held until the cluster is closed: no writer outlives it
                _whole_points(run.dir, run.manifest)
            todo = [(p, run) for p in points for run in runs if run.manifest["points"][p.point_id]["status"] != "ok"]
            with sweep_client(executor, scheduler) if todo else contextlib.nullcontext() as client:
                for run in runs:
                    write_text(run.dir / "sweep.yaml", spec["path"].read_text())
                    write_manifest(run.dir, run.manifest)
                waves = [w for w in ([j for j in todo if j[0].notebook == first],
                                     [j for j in todo if j[0].notebook != first]) if w]
                bar = tqdm(total=len(todo), desc=f"sweep {run_id}" + (" and its twin" if twin else ""),
                           unit="point", disable=not progress)
                try:
                    for wave in waves:
                        _run_points(client, wave, spec, bar, kernel_name, timeout)
                finally:
                    bar.close()
                    for run in runs:
                        _save_combined(run.dir, run.manifest)
    except BaseException:
        for run in runs:                        # a new run that never started leaves nothing behind
            if run.fresh and run.dir.exists() and not any(run.dir.iterdir()):
                run.dir.rmdir()
        raise
    return runs[0].dir


def summary(run_dir: str | Path) -> dict:
    """Counts of ok / failed / damaged / pending points and the failures (point id -> error)."""
    manifest = read_manifest(run_dir)
    status = pd.Series({pid: e.get("status", "pending") for pid, e in manifest["points"].items()})
    return {"run_id": manifest["run_id"], "counts": status.value_counts().to_dict(),
            "failures": {pid: e.get("error") for pid, e in manifest["points"].items()
                         if e.get("status") in ("failed", "interrupted", "damaged")}}


def read_manifest(run_dir: str | Path) -> dict:
    """The ``run.json`` of a run directory, every finished point checked: a point whose files
    are not whole gets status ``damaged`` and the reason as its ``error``.

    Raises
    ------
    DamagedRun
        When the folder has no ``run.json`` or it is unreadable (a ``ValueError``).
    """
    run_dir = Path(run_dir)
    manifest = load_manifest(run_dir)
    if manifest is None:
        raise DamagedRun(f"{run_dir} is not a sweep run (no {MANIFEST})")
    for e in manifest["points"].values():
        why = damage(run_dir, e)
        if why:
            was = f"; the point had failed: {e.get('error')}" if e.get("status") == "failed" else ""
            e.update(status="damaged", error=f"{why}{was}")
    return manifest

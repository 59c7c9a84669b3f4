"""Tidy result tables: one row per measurement, with the run's metadata beside them."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path

import pandas as pd
import torch

from kdtree.bench.timing import clock_summary

from kdtree.bench.atomic import atomic_path, write_text


def git_state(path: str | Path | None = None) -> dict:
    """The checkout's commit and whether its tree is dirty, from git itself.

    Asks ``git rev-parse HEAD`` and ``git status --porcelain`` in ``path`` (default: the folder
    of this package), so it works from any working directory inside the checkout. Outside a
    checkout (an installed wheel, a copy without ``.git``) the commit is ``"unknown"`` and the
    dirty flag None. ``KDTREE_GIT_SHA`` (and ``KDTREE_GIT_DIRTY=1``), when set, take precedence:
    a copy of a checkout made by a remote runner may carry a stale ``.git`` under newer files,
    so the runner passes the commit it copied.

    Returns
    -------
    dict
        ``git_sha`` (full sha or ``"unknown"``) and ``git_dirty`` (bool or None).
    """
    if os.environ.get("KDTREE_GIT_SHA"):
        return {"git_sha": os.environ["KDTREE_GIT_SHA"], "git_dirty": os.environ.get("KDTREE_GIT_DIRTY") == "1"}
    here = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True, timeout=20).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                capture_output=True, text=True, check=True, timeout=60).stdout
        return {"git_sha": sha, "git_dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"git_sha": "unknown", "git_dirty": None}


def run_metadata() -> dict:
    """What a result depends on: device, SMs, L2, driver, library versions, git commit and dirty
    flag, date, and the GPU clocks sampled during the timed work of this process
    (``kdtree.bench.timing.clock_summary``; absent when nothing was timed on a GPU)."""
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **git_state(), "torch": torch.__version__, "python": platform.python_version(),
            "host": platform.node()}
    try:
        import cupy
        meta["cupy"] = cupy.__version__
    except Exception:
        meta["cupy"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(device=p.name, sms=p.multi_processor_count, l2_bytes=p.L2_cache_size,
                    memory_bytes=p.total_memory, capability=f"{p.major}.{p.minor}",
                    cuda_runtime=torch.version.cuda)
        try:
            q = "driver_version,clocks.max.sm"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
            if out:
                drv, smax = [s.strip() for s in out[0].split(",")]
                meta.update(driver=drv, sm_clock_max=smax)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        meta.update(clock_summary())
    else:
        meta.update(device=f"CPU ({platform.processor() or platform.machine()})", sms=None, l2_bytes=None)
    return meta


def save_table(df: pd.DataFrame, path: str | Path, meta: dict | None = None) -> Path:
    """Write ``df`` as parquet (metadata in the schema) plus a CSV and a JSON sidecar for diffs.

    Each file is written under a unique temporary name and renamed into place, the parquet
    last: a killed writer leaves no half file, and a concurrent reader sees the old file or the
    new one.
    """
    path = Path(path).with_suffix(".parquet")
    meta = meta if meta is not None else run_metadata()
    df = df.copy()
    df.attrs["run"] = meta
    write_text(path.with_suffix(".meta.json"), json.dumps(meta, indent=2, default=str) + "\n")
    with atomic_path(path.with_suffix(".csv")) as tmp:
        df.to_csv(tmp, index=False)
    with atomic_path(path) as tmp:
        _parquet_ready(df).to_parquet(tmp, index=False)
    return path


def _parquet_ready(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every object column that mixes value types (a run's combined table can hold a
    column of one name from two notebooks, numbers in one and names in the other) as text, the
    way the CSV holds it; parquet columns have one type. Missing values stay missing."""
    mixed = [c for c in df.columns if df[c].dtype == object
             and df[c].dropna().map(lambda v: type(v).__name__).nunique() > 1]
    if not mixed:
        return df
    out = df.copy()
    for c in mixed:
        out[c] = out[c].map(lambda v: v if v is None or (isinstance(v, float) and v != v) else str(v))
    return out


def load_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by ``save_table``; its metadata is in ``df.attrs["run"]``.

    Raises
    ------
    ValueError
        Naming the file, when the parquet or its metadata sidecar is missing or unreadable.
    """
    path = Path(path).with_suffix(".parquet")
    meta = path.with_suffix(".meta.json")
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError) as exc:          # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{path}: unreadable table ({type(exc).__name__}: {str(exc)[:200]})") from exc
    if meta.exists():
        try:
            df.attrs["run"] = json.loads(meta.read_text())
        except ValueError as exc:
            raise ValueError(f"{meta}: unreadable metadata ({exc})") from exc
    return df

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


def git_sha() -> str:
    """Short sha of the checkout (``+dirty`` when it has uncommitted changes), or ``unknown``.

    ``KDTREE_GIT_SHA`` overrides it, for copies of a checkout without ``.git`` (GPU hosts).
    """
    if os.environ.get("KDTREE_GIT_SHA"):
        return os.environ["KDTREE_GIT_SHA"]
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_metadata() -> dict:
    """What a result depends on: device, SMs, L2, clocks, driver, library versions, git sha, date."""
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": git_sha(), "torch": torch.__version__, "python": platform.python_version(),
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
            q = "driver_version,clocks.sm,clocks.max.sm,clocks.mem"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
            if out:
                drv, sm, smax, mem = [s.strip() for s in out[0].split(",")]
                meta.update(driver=drv, sm_clock=sm, sm_clock_max=smax, mem_clock=mem)
        except (OSError, subprocess.SubprocessError):
            pass
    else:
        meta.update(device=f"CPU ({platform.processor() or platform.machine()})", sms=None, l2_bytes=None)
    return meta


def save_table(df: pd.DataFrame, path: str | Path, meta: dict | None = None) -> Path:
    """Write ``df`` as parquet (metadata in the schema) plus a CSV and a JSON sidecar for diffs."""
    path = Path(path).with_suffix(".parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = meta if meta is not None else run_metadata()
    df = df.copy()
    df.attrs["run"] = meta
    df.to_parquet(path, index=False)
    df.to_csv(path.with_suffix(".csv"), index=False)
    path.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return path


def load_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by ``save_table``; its metadata is in ``df.attrs["run"]``."""
    path = Path(path).with_suffix(".parquet")
    df = pd.read_parquet(path)
    meta = path.with_suffix(".meta.json")
    if meta.exists():
        df.attrs["run"] = json.loads(meta.read_text())
    return df

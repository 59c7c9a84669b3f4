"""One CPU run of the CI sweep (every notebook through papermill) and its report, shared by the
workbook tests and the browser test of one pytest process."""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI_SWEEP = ROOT / "parameterized_runs" / "ci_cpu.yaml"


@functools.cache
def cpu_run() -> tuple[Path, Path]:
    """Execute ``parameterized_runs/ci_cpu.yaml`` on the CPU and render its report.

    Returns (run directory, reports folder), both in a temporary folder removed at exit.
    """
    from kdtree.bench.report import render_run
    from kdtree.bench.sweep import run_sweep

    tmp = Path(tempfile.mkdtemp(prefix="kdtree-workbook-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    run_dir = run_sweep(CI_SWEEP, run_id="ci", profile="cpu", out_root=tmp / "runs", progress=False)
    render_run(run_dir, tmp / "reports")
    return run_dir, tmp / "reports"

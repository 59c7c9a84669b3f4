"""Interactive use in a copy of the checkout: the main job (`kdtree sweep ... --report`) and every
notebook opened by hand from notebooks/ (its defaults, notebooks/ as the working folder, as
JupyterLab runs it) leave `git status` clean apart from ignored paths, and 99_summary finds the
latest run from there."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from workbook_run import ROOT


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The working tree's files git would show (tracked and untracked, not ignored) in a fresh
    repository with one commit, so that its `git status` starts clean."""
    dest = tmp_path_factory.mktemp("checkout")
    files = _git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "copy")
    assert _git(dest, "status", "--porcelain") == ""
    return dest


def test_main_job_and_notebooks_by_hand_leave_git_status_clean(checkout):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    before = {d.name for d in (checkout / "parameterized_runs").iterdir()}
    job = subprocess.run([sys.executable, "-m", "kdtree.cli", "sweep", "parameterized_runs/ci_cpu.yaml",
                          "--profile", "cpu", "--report"], cwd=checkout, capture_output=True, text=True, env=env,
                         timeout=900)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    runs = [d for d in (checkout / "parameterized_runs").iterdir() if d.name not in before]
    assert len(runs) == 1 and (checkout / "reports" / runs[0].name / "index.html").exists()
    assert (checkout / "reports" / "local.html").exists()

    nb_dir = checkout / "notebooks"
    for path in sorted(nb_dir.glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(nb_dir)}}).execute()
        if path.stem == "99_summary":
            text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
            assert runs[0].name in text, "99_summary opened by hand did not find the latest run"

    assert _git(checkout, "status", "--porcelain") == "", "the main job or a notebook left files git sees"
    ignored = _git(checkout, "status", "--porcelain", "--ignored")
    assert "notebooks/results/" in ignored and "reports/local.html" in ignored

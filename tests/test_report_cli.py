"""`kdtree report` and `kdtree sweep` as a user runs them, in a fresh process: the terminal shows
what they did and none of the kernel's start-up chatter (ipykernel's "Kernel is running over TCP
without encryption" warning, which a TCP kernel prints at every notebook it executes)."""
from __future__ import annotations

import os
import subprocess
import sys

import nbformat
import yaml

from workbook_run import ROOT, cpu_run

KERNEL_CHATTER = ("without encryption", "IPKernelApp")


def kdtree(*args: str) -> subprocess.CompletedProcess:
    """Run ``python -m kdtree.cli *args`` on this checkout; stdout and stderr together."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kdtree.cli", *args], cwd=ROOT, env=env, timeout=600,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_report_prints_the_page_and_no_kernel_warning(tmp_path):
    run_dir, _ = cpu_run()
    p = kdtree("report", str(run_dir), "--reports", str(tmp_path / "reports"))
    page = tmp_path / "reports" / "ci" / "index.html"
    assert p.returncode == 0, p.stdout
    assert str(page) in p.stdout and page.exists()
    assert not [line for line in p.stdout.splitlines() if any(c in line for c in KERNEL_CHATTER)], p.stdout


def test_sweep_prints_its_summary_and_no_kernel_warning(tmp_path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('x = 0\nresults_path = ""\nceilings_path = ""\nrun_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import pandas as pd\nfrom kdtree.bench.results import save_table\n"
        "save_table(pd.DataFrame({'kernel': ['k'], 'x': [x], 'median_us': [5.0]}), results_path, meta={})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, str(tmp_path / "nb" / "t.ipynb"))
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "t.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "notebooks": [{"notebook": "nb/t.ipynb", "grid": {"x": [1, 2]}}]}))
    p = kdtree("sweep", str(spec), "--run-id", "quiet")
    assert p.returncode == 0, p.stdout
    assert "run quiet in" in p.stdout and "ok" in p.stdout
    assert not [line for line in p.stdout.splitlines() if any(c in line for c in KERNEL_CHATTER)], p.stdout

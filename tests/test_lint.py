"""Pyflakes-class errors (undefined names, unused imports) fail CI: the GPU-only code paths are
not executed on CPU, so a NameError there would otherwise first show up on a GPU host."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_undefined_names_or_unused_imports():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache",
                          "--output-format", "concise", "kdtree", "tests", "scripts"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr

"""Pyflakes-class errors (undefined names, unused imports) fail CI: the GPU-only code paths are
not executed on CPU, so a NameError there would otherwise first show up on a GPU host. So does a
function defined in a loop that reads the loop's variables unbound (B023): called after the loop
has moved on, it sees the last iteration's (timings deferred to the end of a sweep called the
last point's tree, and three default verify-attention points failed on an H200)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_undefined_names_or_unused_imports():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F,B023", "--no-cache",
                          "--output-format", "concise", "kdtree", "tests", "scripts"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr

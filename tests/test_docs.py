"""The project documents itself: no pointer to files outside the repository or to issue
numbers, and docs/design.md names modules and functions that exist."""
import re
import subprocess
from pathlib import Path

import pytest

import kdtree
import kdtree.attention

ROOT = Path(__file__).resolve().parent.parent
TEXT = (".py", ".md", ".yaml", ".yml", ".sh", ".cu", ".cuh", ".toml", ".j2", ".cfg", ".txt", ".ipynb")
HISTORY = ("results/", "reports/")  # committed run artifacts, kept as they were recorded


def project_files():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        executed_run = f.startswith("parameterized_runs/") and f.count("/") > 1
        if f.endswith(TEXT) and not f.startswith(HISTORY) and not executed_run and (ROOT / f).is_file():
            yield f


OUTSIDE = re.compile(r"shared/DESIGN|DESIGN\.md|\b[Ii]ssue #?\d+|\(#\d+\)")


def test_no_pointer_outside_the_project():
    hits = [f"{f}:{i}: {line.strip()}" for f in project_files()
            for i, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1)
            if OUTSIDE.search(line) and f != "tests/test_docs.py"]
    assert not hits, "\n".join(hits)


DESIGN = (ROOT / "docs" / "design.md").read_text()


@pytest.mark.parametrize("path", sorted(set(re.findall(r"^ {0,2}(\S+\.py|\S+/) ", DESIGN, re.MULTILINE))))
def test_design_layout_names_existing_files(path):
    assert (ROOT / "kdtree" / path).exists() or (ROOT / path).exists(), path


@pytest.mark.parametrize("name", sorted(set(re.findall(r"`(\w+)\(", DESIGN))))
def test_design_names_existing_functions(name):
    assert hasattr(kdtree, name) or hasattr(kdtree.attention, name), name

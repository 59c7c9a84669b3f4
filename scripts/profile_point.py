"""Where the time of a sweep's points goes: each point's notebook code cells run in this process
with the point's parameters injected as papermill injects them, under cProfile; prints each
cell's wall time and the functions with the most cumulative time (kdtree's own first).

Usage (GPU host, from the repository root):
    PYTHONPATH=. python scripts/profile_point.py parameterized_runs/default.yaml [NOTEBOOK[:LABEL] ...]
NOTEBOOK is a notebook's stem or prefix (02_verify_attention, 05); no argument profiles every
entry. The results land in a temporary folder; nothing is written into the repository.
"""
from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from kdtree.bench.sweep_spec import load_spec

TOP = 25


def _selected(entries: list[dict], wanted: list[str]) -> list[dict]:
    if not wanted:
        return entries
    out = []
    for w in wanted:
        stem, _, label = w.partition(":")
        hits = [e for e in entries if Path(e["notebook"]).stem.startswith(stem) and (not label or e.get("label") == label)]
        if not hits:
            raise SystemExit(f"profile_point: no entry matches {w!r}")
        out += hits
    return out


def profile_entry(entry: dict, root: Path, tmp: Path) -> None:
    """Run the entry's notebook cells in-process under cProfile and print the figures. The
    ceilings are measured by the first entry into ``tmp`` and read by the others, as a sweep's
    points read the run's."""
    nb = nbformat.read(root / entry["notebook"], as_version=4)
    params = dict(entry.get("parameters", {}), results_path=str(tmp / Path(entry["notebook"]).stem / "results"),
                  ceilings_path=str(tmp / "ceilings.json"), run_dir="")
    ns: dict = {"__name__": "__profiled_notebook__"}
    name = f"{Path(entry['notebook']).stem}:{entry.get('label', '')}"
    prof, cells = cProfile.Profile(), []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        src = cell.source
        t0 = time.perf_counter()
        prof.enable()
        with contextlib.redirect_stdout(io.StringIO()):   # the cells' tables and figures
            exec(compile(src, f"{name} cell {i}", "exec"), ns)
        if "parameters" in cell.metadata.get("tags", []):
            ns.update(params)   # papermill's injected cell follows the parameters cell
        prof.disable()
        cells.append((time.perf_counter() - t0, i, src.splitlines()[0][:70] if src else ""))
    print(f"\n== {name}: {sum(c[0] for c in cells):.1f} s of cells")
    for secs, i, first in sorted(cells, reverse=True)[:5]:
        print(f"  cell {i:2d} {secs:6.1f} s  {first}")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("cumulative")
    stats.print_stats(r"kdtree", TOP)
    stats.print_stats(TOP)
    print("\n".join(ln for ln in out.getvalue().splitlines() if ln.strip() and not ln.startswith("   Ordered")))


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    spec = load_spec(argv[0])
    tmp = Path(tempfile.mkdtemp(prefix="kdtree_profile_"))
    for entry in _selected(spec["notebooks"], argv[1:]):
        profile_entry(entry, Path(spec["root"]), tmp)


if __name__ == "__main__":
    main(sys.argv[1:])

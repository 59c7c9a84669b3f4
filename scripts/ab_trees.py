"""Run a child script once per source tree, all trees in turn, twice (the A/B scripts' driver).

A tree is a folder holding ``kdtree/`` and ``cuda/`` (``git archive <commit> kdtree cuda`` unpacked,
or a copy with one change); each child process imports the package from it (``PYTHONPATH``) and
prints one ``RESULT <json>`` line. Alternating the trees in one call keeps a slow or fast spell of
the GPU from landing on one side only. ``TREE@NAME=VALUE`` runs the tree with that environment
variable set (``.@KDTREE_FUSED_IMPL=tma_seq``: the same code, another kernel).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def alternate(script: str, trees: list[str], args: list[str], passes: int = 2) -> dict[str, list]:
    """{tree: [the child's RESULT of each pass]}; exits with the child's output if one fails."""
    rows: dict[str, list] = {}
    for _ in range(passes):
        for tree in trees:
            path, _, setting = tree.partition("@")
            env = os.environ | {"PYTHONPATH": os.pathsep.join([str(Path(path).resolve()), str(Path(script).parent)])}
            if setting:
                name, eq, value = setting.partition("=")
                if not (name and eq):
                    sys.exit(f"tree {tree!r}: expected TREE@NAME=VALUE")
                env[name] = value
            res = subprocess.run([sys.executable, script, "--child", *args], env=env, capture_output=True, text=True)
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
            if res.returncode or not line:
                sys.exit(f"{tree} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
            rows.setdefault(tree, []).append(json.loads(line[0][7:]))
    return rows


def table(script: str, argv: list[str], defaults: list[str], key: str, width: int, cell, lead=None) -> None:
    """Parse ``TREE ... [-- ITEM ...]`` (items default to ``defaults``), run ``alternate`` and print
    one row per item: ``lead`` (name, function of the first result) then ``cell(result)`` per tree
    and pass."""
    trees, items = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    items = items or defaults
    rows = alternate(script, trees, items)
    names = [Path(t.partition("@")[0]).resolve().name + (f"@{t.partition('@')[2]}" if "@" in t else "")
             for t in trees]
    head = f"{key:>15} " + (f"{lead[0]:>7} " if lead else "")
    print(head + " ".join(f"{n} #{r + 1}".rjust(width) for r in range(2) for n in names))
    for item in items:
        cells = [rows[t][r][item] for r in range(2) for t in trees]
        print(f"{item:>15} " + (f"{lead[1](cells[0])!s:>7} " if lead else "")
              + " ".join(cell(c).rjust(width) for c in cells))

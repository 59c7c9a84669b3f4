"""Rank Nsight Compute stall samples: the hottest SASS lines of a ``--page source --csv
--print-source sass`` export, the samples summed per opcode, and (with ``--raw``, a ``--page raw
--csv`` export of the same report) the warp-state stall reasons of each kernel.

    python scripts/ncu_rank.py SOURCE_CSV [--raw RAW_CSV] [--top 40]
"""
from __future__ import annotations

import argparse
import csv
import re
from collections import Counter


def source_lines(path: str) -> tuple[list[str], list[list[str]]]:
    """The export's header and SASS rows (the first table in the file, if it holds several)."""
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    cols = rows[head]
    body = []
    for r in rows[head + 1:]:
        if len(r) != len(cols) or r == cols:
            break
        body.append(r)
    return cols, body


def opcode(sass: str) -> str:
    """``@!P0 HGMMA.64x256x16.F32.BF16 ...`` -> ``HGMMA``."""
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def rank_source(path: str, top: int) -> None:
    cols, body = source_lines(path)
    src = cols.index("Source")
    samp = next(i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All"))
    val = lambda r: float(r[samp] or 0)  # noqa: E731
    total = sum(val(r) for r in body) or 1.0
    print(f"{path}: {len(body)} SASS lines, {total:.0f} stall samples")
    per_op = Counter()
    for r in body:
        per_op[opcode(r[src])] += val(r)
    print("samples per opcode: " + ", ".join(f"{op} {v / total:.1%}" for op, v in per_op.most_common(12)))
    print(f"hottest {top} lines:")
    for r in sorted(body, key=lambda r: -val(r))[:top]:
        print(f"{val(r) / total:6.1%}  {r[0]:>6}  {r[src][:100]}")


def rank_raw(path: str) -> None:
    rows = list(csv.reader(open(path)))
    cols = rows[0]
    name = cols.index("Kernel Name")
    stall = [i for i, c in enumerate(cols) if re.match(r"smsp__pcsamp_warps_issue_stalled_\w+$", c)
             and not c.endswith("_not_issued")]
    for r in rows[2:]:   # row 1 holds the units
        vals = {cols[i].removeprefix("smsp__pcsamp_warps_issue_stalled_"): float(r[i].replace(",", "") or 0)
                for i in stall}
        total = sum(vals.values()) or 1.0
        top = sorted(vals.items(), key=lambda kv: -kv[1])[:10]
        print(f"{r[name][:40]}: {total:.0f} samples; " + ", ".join(f"{k} {v / total:.1%}" for k, v in top))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("--raw")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    if a.raw:
        rank_raw(a.raw)
    rank_source(a.source, a.top)


if __name__ == "__main__":
    main()

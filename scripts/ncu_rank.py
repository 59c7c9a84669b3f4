"""Rank Nsight Compute stall samples: the hottest SASS lines of a ``--page source --csv
--print-source sass`` export, the samples summed per opcode, and (with ``--raw``, a ``--page raw
--csv`` export of the same report) the warp-state stall reasons of each kernel. Either file may
be gzipped (``.gz``).

    python scripts/ncu_rank.py SOURCE_CSV [--raw RAW_CSV] [--top 40]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import re
from collections import Counter

STALL = re.compile(r"smsp__pcsamp_warps_issue_stalled_(\w+)$")


def _rows(path: str) -> list[list[str]]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return list(csv.reader(f))


def _num(text: str) -> float:
    return float(text.replace(",", "") or 0)


def source_lines(path: str) -> tuple[list[str], list[list[str]]]:
    """The export's header and SASS rows (the first table in the file, if it holds several)."""
    rows = _rows(path)
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


def source_samples(path: str) -> tuple[list[tuple[float, str, str]], Counter]:
    """(samples, address, SASS) per line, and the samples summed per opcode."""
    cols, body = source_lines(path)
    src = cols.index("Source")
    samp = next(i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All"))
    lines = [(_num(r[samp]), r[0], r[src]) for r in body]
    per_op = Counter()
    for v, _, sass in lines:
        per_op[opcode(sass)] += v
    return lines, per_op


def raw_stalls(path: str) -> list[tuple[str, dict[str, float], float]]:
    """Per kernel of a raw export: its name, samples per stall reason, and the sample count
    (``smsp__pcsamp_sample_count``; the reasons' sum where the export lacks it)."""
    rows = _rows(path)
    cols = rows[0]
    name = cols.index("Kernel Name")
    count = cols.index("smsp__pcsamp_sample_count") if "smsp__pcsamp_sample_count" in cols else None
    stall = {i: m.group(1) for i, c in enumerate(cols) if (m := STALL.match(c)) and not c.endswith("_not_issued")}
    out = []
    for r in rows[2:]:   # row 1 holds the units
        reasons = {reason: _num(r[i]) for i, reason in stall.items()}
        out.append((r[name], reasons, _num(r[count]) if count is not None else sum(reasons.values())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("--raw")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    if a.raw:
        for kernel, reasons, _ in raw_stalls(a.raw):
            total = sum(reasons.values()) or 1.0
            top = sorted(reasons.items(), key=lambda kv: -kv[1])[:10]
            print(f"{kernel[:40]}: {total:.0f} samples; " + ", ".join(f"{k} {v / total:.1%}" for k, v in top))
    lines, per_op = source_samples(a.source)
    total = sum(v for v, _, _ in lines) or 1.0
    print(f"{a.source}: {len(lines)} SASS lines, {total:.0f} stall samples")
    print("samples per opcode: " + ", ".join(f"{op} {v / total:.1%}" for op, v in per_op.most_common(12)))
    print(f"hottest {a.top} lines:")
    for v, addr, sass in sorted(lines, key=lambda x: -x[0])[:a.top]:
        print(f"{v / total:6.1%}  {addr:>6}  {sass[:100]}")


if __name__ == "__main__":
    main()

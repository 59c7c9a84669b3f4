"""Bytes of machine code in each kernel of the package's nvcc builds (no GPU needed).

    python scripts/code_size.py [--tree DIR] [--arch sm_90a] [FAMILY ...] [-D NAME=VALUE ...]

A kernel's first wave fetches its code from HBM once the L2 no longer holds it (in a model's
forward, after an MoE layer streamed its weights): on an H200 the pair kernel's first tiles took
about 4 us longer with its code cold than warm (docs/perf_log.md, session 23), time on every short
launch. Prints, per kernel family (``cuda/<FAMILY>.cu``, default: the verify-attention
families), each ``extern "C" __global__`` entry's ``.text`` section in bytes and instructions
(16 bytes each on sm_90). ``--tree DIR`` builds another checkout's sources (a folder holding
``kdtree/`` and ``cuda/``, e.g. ``git archive REV kdtree cuda``), to compare two revisions.
"""
from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

FAMILIES = ("verify_attention", "verify_attention_pair", "verify_attention_tma", "verify_attention_wgmma",
            "verify_attention_rows_n")


def text_sections(cubin: bytes) -> dict[str, int]:
    """Each ``.text.<function>`` section of an ELF64 (little-endian) cubin: function -> bytes."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i: int) -> tuple[int, int, int]:   # name offset, file offset, size
        name, _, _, _, off, size = struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
        return name, off, size

    _, str_off, str_size = header(shstrndx)
    names = cubin[str_off:str_off + str_size]
    out = {}
    for i in range(shnum):
        name_at, _, size = header(i)
        name = names[name_at:names.index(b"\0", name_at)].decode()
        if name.startswith(".text."):
            out[name[len(".text."):]] = size
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", help=f"kernel families (default: {', '.join(FAMILIES)})")
    ap.add_argument("--tree", type=Path, help="a checkout holding kdtree/ and cuda/ (default: this one)")
    ap.add_argument("--arch", default="sm_90a", help="sm_90a (default) or sm_90")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="a define for every family (repeatable)")
    args = ap.parse_args(argv)
    bad = [d for d in args.defines if "=" not in d]
    if bad:
        ap.error(f"-D {bad[0]!r}: expected NAME=VALUE")
    if args.tree is not None:
        if not (args.tree / "kdtree").is_dir() or not (args.tree / "cuda").is_dir():
            ap.error(f"--tree {args.tree}: no kdtree/ and cuda/ there")
        sys.path.insert(0, str(args.tree.resolve()))
    from kdtree import kernels

    families = args.families or [f for f in FAMILIES if f in kernels.sources()]
    unknown = [f for f in families if f not in kernels.sources()]
    if unknown:
        ap.error(f"unknown kernel family {unknown[0]!r}; have {', '.join(kernels.sources())}")
    defines = dict(d.split("=", 1) for d in args.defines)
    print(f"sources: {kernels.cuda_dir()}, {args.arch}" + (f", {defines}" if defines else ""))
    print("| family | kernel | code bytes | instructions |\n|---|---|---|---|")
    for fam in families:
        sizes = text_sections(kernels.nvcc_compile(fam, defines, arch=args.arch).read_bytes())
        for fn, size in sorted(sizes.items()):
            print(f"| {fam} | {fn} | {size} | {size // 16} |")


if __name__ == "__main__":
    main()

"""The ``kdtree`` command.

    kdtree bench tree [--budgets ...] [--batches ...] [--out PATH]   tree build / accept / compaction
"""
from __future__ import annotations

import argparse
import sys


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _bench_tree(args) -> int:
    from kdtree.bench.tree_bench import run_tree_bench

    run_tree_bench(budgets=args.budgets, batches=args.batches, depth=args.depth, out=args.out,
                   quick=args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kdtree", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark and print its table")
    bsub = bench.add_subparsers(dest="what", required=True)
    t = bsub.add_parser("tree", help="GPU tree build against the CPU paths; accept and compaction")
    t.add_argument("--budgets", type=_ints, default=None,
                   help="comma-separated budgets (default 16..1024 on GPU, fewer on CPU)")
    t.add_argument("--batches", type=_ints, default=None, help="comma-separated batch sizes")
    t.add_argument("--depth", type=int, default=15, help="draft depth L (default 15)")
    t.add_argument("--out", default="results/tree_bench", help="table path without suffix")
    t.add_argument("--quick", action="store_true", help="fewer repetitions")
    t.set_defaults(func=_bench_tree)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

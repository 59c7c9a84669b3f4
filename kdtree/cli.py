"""The ``kdtree`` command.

    kdtree bench tree [--budgets ...] [--batches ...] [--out PATH]   tree build / accept / compaction
    kdtree sweep parameterized_runs/default.yaml [--report]          execute the notebooks over a grid
        [--executor local|dask] [--scheduler tcp://host:port]        on every GPU here, or on a Dask cluster
        [--twin]                                                     and a second run beside it, point by point
    kdtree report <run-id> [--png]                                   reports/<run-id>/index.html
    kdtree compare <run-a> <run-b>                                   regression report of two runs
    kdtree wheelhouse [--dest .whl]                                  offline wheels of the notebook stack
    kdtree profile [--out DIR] [--points FILE.json|JSON] [--full]    kernels under Nsight Compute vs the cost model
    kdtree plan <run-id|ceilings.json> --batch B --nodes N --heads H --prefix P
                                                                     verify calls' plans and roof floors, no GPU

A mistake in what was asked (a bad argument or file, a missing run) prints one line
"kdtree: error: ..." and exits with status 2; --debug (anywhere on the line) adds the traceback.
A mistyped option is named with the nearest one the command knows.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
import traceback

from kdtree.checks import UserError
from kdtree.tree import MAX_BUDGET, MAX_DEPTH


def _ints(low: int, high: int | None = None):
    """An argparse type: comma-separated integers, each in ``low..high``."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        bad = [v for v in values if v < low or (high is not None and v > high)]
        if not values or bad:
            span = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"each value must be an integer {span}, got {text!r}")
        return values
    return parse


def _int(low: int, high: int | None = None):
    """An argparse type: one integer in ``low..high`` (no upper bound where ``high`` is None)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            span = f"in {low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {text!r}")
        return value
    return parse


def _bench_tree(args) -> int:
    from kdtree.bench.tree_bench import run_tree_bench

    run_tree_bench(budgets=args.budgets, batches=args.batches, depth=args.depth, out=args.out,
                   quick=args.quick)
    return 0


def _run_dir(text: str, root: str) -> str:
    """The run folder ``text`` names: a directory, or a run id under ``root``."""
    from pathlib import Path

    places = list(dict.fromkeys((Path(text), Path(root) / text)))   # one place for an absolute path
    for p in places:
        if p.is_dir():
            return str(p)
    raise UserError(f"run {text!r}: no such run directory (looked for {' and '.join(map(str, places))})")


def _sweep(args) -> int:
    from kdtree.bench.report import render_run
    from kdtree.bench.sweep import TWIN, run_sweep, summary

    try:
        run_dir = run_sweep(args.spec, run_id=args.run_id, resume=args.resume, profile=args.profile,
                            timeout=args.timeout, executor=args.executor, scheduler=args.scheduler, twin=args.twin)
    except KeyboardInterrupt:
        print("sweep interrupted: finished points are kept; run again with the same --run-id (or --resume)",
              file=sys.stderr)
        return 130
    runs = [run_dir] + ([run_dir.with_name(run_dir.name + TWIN)] if args.twin else [])
    failed = False
    for run in runs:
        s = summary(run)
        if args.report:
            print(f"report: {render_run(run, args.reports)}")
        print(f"run {s['run_id']} in {run}: {s['counts']}")
        for pid, err in s["failures"].items():
            print(f"  FAILED {pid}: {err}")
        failed |= bool(s["failures"])
    if args.twin:
        print(f"compare the twins: kdtree compare {runs[0]} {runs[1]}")
    return 1 if failed else 0


def _report(args) -> int:
    from pathlib import Path

    from kdtree.bench.report import render_run

    run_dir = _run_dir(args.run, args.runs)
    if not (Path(run_dir) / "ceilings.json").exists():
        raise UserError(f"run {Path(run_dir).name} ({run_dir}) has no ceilings.json: its ceilings notebook "
                        "has not finished; resume the sweep to measure them")
    index = render_run(run_dir, args.reports, publish=args.publish)
    print(index)
    if args.publish:
        print(f"published; to commit: git add -f {run_dir} {index.parent} {Path(args.reports) / 'index.html'}")
    if args.png:
        from kdtree.bench.figures import export_pngs

        for png in export_pngs(run_dir, index.parent / "figures"):
            print(png)
    return 0


def _compare(args) -> int:
    from kdtree.bench.report import compare_runs

    page = compare_runs(_run_dir(args.run_a, args.runs), _run_dir(args.run_b, args.runs), args.reports,
                        publish=args.publish)
    print((page.parent / "summary.txt").read_text(), end="")
    print(f"report: {page}")
    if args.publish:
        print(f"published; to commit: git add -f {page.parent} {page.parent.parent / 'index.html'}")
    return 0


def _plan(args) -> int:
    import itertools
    from pathlib import Path

    import pandas as pd

    from kdtree.bench.ceilings import Ceilings
    from kdtree.bench.plan import plan_table, render

    path = Path(args.ceilings)
    if not path.is_file():
        path = Path(_run_dir(args.ceilings, args.runs)) / "ceilings.json"
        if not path.exists():
            raise UserError(f"run {args.ceilings!r} ({path.parent}) has no ceilings.json: its ceilings notebook has "
                            "not finished")
    ceilings = Ceilings.load(path)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    tables = [plan_table(ceilings, batch=b, nodes=n, heads=h, prefix=p, variants=variants, l2=args.l2,
                         num_sms=args.sms)
              for b, n, h, p in itertools.product(args.batch, args.nodes, args.heads, args.prefix)]
    table = pd.concat(tables, ignore_index=True)
    if args.csv:
        print(table.to_csv(index=False, float_format="%.6g"), end="")
    else:
        print(render(table, ceilings, str(path), l2=args.l2))
    return 0


def _profile(args) -> int:
    import json
    from pathlib import Path

    import pandas as pd

    from kdtree.bench.counters import compare, default_points, profile

    points = default_points(quick=not args.full)
    if args.points:  # a JSON file, or the list itself
        text = args.points if args.points.lstrip()[:1] in ("[", "{") else Path(args.points).read_text()
        try:
            points = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"--points: not a JSON list of points ({e})") from None
    try:
        joined = profile(points, args.out)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    table = compare(joined, per_launch=False)
    cols = ["kernel", "variant", "q_len", "budget", "splits", "figure", "modelled", "counter", "ratio", "flag"]
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print(table[[c for c in cols if c in table.columns]].to_string(index=False))
    flagged = table[table["target"] & (table["flag"] != "")]
    print(f"{args.out}: {len(joined)} launches; {len(flagged)} target figure(s) beyond tolerance")
    return 0


def _wheelhouse(args) -> int:
    from kdtree.bench.wheelhouse import STACK, build_wheelhouse

    dest = build_wheelhouse(args.dest, python_version=args.python_version, skip_installed=args.skip_installed)
    print(f"{dest}: {len(list(dest.glob('*.whl')))} wheels; on the GPU host:\n"
          f"  python3 -m pip install --no-index --find-links {dest} {' '.join(STACK)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are UserErrors (one line, exit 2) and whose help is plain text.

    An option no parser on the command's path knows, near one they do know, is named first with
    that one: argparse would report a required option that a typo left out (``--prefx 4096``:
    "required: --prefix") before the typo itself."""

    def error(self, message: str):
        unknown, near, prog = _unknown_options()
        if near:
            message, self.prog = f"unrecognized arguments: {' '.join(unknown)} (did you mean {near}?)", prog
        raise UserError(f"{message} (see {self.prog} --help)")

    def format_help(self) -> str:
        text = super().format_help()
        return re.sub(r"``(.+?)``|:\w+:`~?(.+?)`", lambda m: m.group(1) or m.group(2), text)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kdtree", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (accepted anywhere)")
    sub = p.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark and print its table")
    bsub = bench.add_subparsers(dest="what", required=True)
    t = bsub.add_parser("tree", help="GPU tree build against the CPU paths; accept and compaction")
    t.add_argument("--budgets", type=_ints(1, MAX_BUDGET), default=None,
                   help=f"comma-separated budgets, each 1..{MAX_BUDGET} (default 16..1024 on GPU, fewer on CPU)")
    t.add_argument("--batches", type=_ints(1), default=None, help="comma-separated batch sizes, each >= 1")
    t.add_argument("--depth", type=_int(1, MAX_DEPTH), default=15, help=f"draft depth L, 1..{MAX_DEPTH} (default 15)")
    t.add_argument("--out", default="results/tree_bench", help="table path without suffix")
    t.add_argument("--quick", action="store_true", help="fewer repetitions")
    t.set_defaults(func=_bench_tree)

    s = sub.add_parser("sweep", help="execute the notebooks of a sweep file with papermill")
    s.add_argument("spec", help="sweep file, e.g. parameterized_runs/default.yaml")
    s.add_argument("--run-id", default=None, help="run directory name; an existing run is resumed")
    s.add_argument("--resume", action="store_true", help="resume the latest run of this sweep")
    s.add_argument("--profile", choices=("auto", "gpu", "cpu"), default="auto",
                   help="GPU sizes or the small CPU sizes (default: what this machine has)")
    s.add_argument("--timeout", type=float, default=None, help="per-cell timeout in seconds")
    s.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="local: one worker per visible GPU (one on CPU); dask: --scheduler's cluster, "
                        "else a LocalCUDACluster (dask-cuda) or LocalCluster it starts")
    s.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="with --executor dask: the address of a running Dask scheduler")
    s.add_argument("--twin", action="store_true",
                   help="also write <run-id>-twin, the same sweep point by point beside it (each point runs "
                        "twice in a row), for `kdtree compare` of two runs made together")
    s.add_argument("--report", action="store_true", help="render the run's report afterwards")
    s.add_argument("--reports", default="reports", help="reports folder (default reports/)")
    s.set_defaults(func=_sweep)

    r = sub.add_parser("report", help="render reports/<run-id>/ and reports/index.html")
    r.add_argument("run", help="run id (under --runs) or run directory")
    r.add_argument("--runs", default="parameterized_runs", help="where run directories live")
    r.add_argument("--reports", default="reports", help="reports folder (default reports/)")
    r.add_argument("--png", action="store_true",
                   help="also write the headline charts as PNGs (README images; needs chromium)")
    r.add_argument("--publish", action="store_true",
                   help="list the run in reports/index.html, the committed list of runs (default: local.html only)")
    r.set_defaults(func=_report)

    c = sub.add_parser("compare", help="what changed from run a to run b: every common point, flagged beyond the noise")
    c.add_argument("run_a", help="baseline run id or directory")
    c.add_argument("run_b", help="new run id or directory")
    c.add_argument("--runs", default="parameterized_runs", help="where run directories live")
    c.add_argument("--reports", default="reports", help="reports folder (default reports/)")
    c.add_argument("--publish", action="store_true", help="list the comparison in reports/index.html")
    c.set_defaults(func=_compare)

    pr = sub.add_parser("profile", help="every kernel under Nsight Compute, joined to the cost model (GPU host)")
    pr.add_argument("--out", default="results/counters", help="folder for the report, raw CSV and table")
    pr.add_argument("--points", default=None, help="a JSON file holding a list of points, or the list itself "
                    "(default: kdtree.bench.counters.default_points)")
    pr.add_argument("--full", action="store_true", help="the larger default point set (N=257 too)")
    pr.set_defaults(func=_profile)

    pl = sub.add_parser("plan", help="a verify-attention call's launch plan and the time each roof of a measured "
                        "device allows (no GPU needed)")
    pl.add_argument("ceilings", help="the device's measured ceilings: a run id (under --runs), a run directory, "
                    "or a ceilings.json")
    pl.add_argument("--batch", type=_ints(1), required=True, help="B, sequences (comma-separated: each)")
    pl.add_argument("--nodes", type=_ints(1), required=True,
                    help="N, tree nodes a sequence (budget + 1, q_len; comma-separated: each)")
    pl.add_argument("--heads", type=_ints(1), required=True,
                    help="H, attention heads on this GPU (64 / TP degree; comma-separated: each)")
    pl.add_argument("--prefix", type=_ints(0), required=True,
                    help="P, prefix (cached) tokens a sequence (comma-separated: each)")
    pl.add_argument("--variants", default="fused,cascade,naive", help="comma-separated, of fused, cascade, naive "
                    "(default all three)")
    pl.add_argument("--l2", choices=("cold", "warm"), default="cold", help="L2 state (default cold)")
    pl.add_argument("--sms", type=_int(1), default=132, help="streaming multiprocessors (default 132: H100, H200)")
    pl.add_argument("--csv", action="store_true", help="print the table as CSV (plan_table's columns) for scripts")
    pl.add_argument("--runs", default="parameterized_runs", help="where run directories live")
    pl.set_defaults(func=_plan)

    w = sub.add_parser("wheelhouse", help="download wheels of the notebook stack for an offline GPU host")
    w.add_argument("--dest", default=".whl", help="folder for the wheels (default .whl, git-ignored)")
    w.add_argument("--python-version", default="3.12", help="the GPU host's Python (default 3.12)")
    w.add_argument("--skip-installed", default=None,
                   help="the host's `pip list --format=freeze`: leave out what it already has")
    w.set_defaults(func=_wheelhouse)
    return p


_REQUEST: dict = {}   # the parser and arguments main() is parsing, for _Parser.error


def _unknown_options() -> tuple[list[str], str | None, str]:
    """The ``--options`` of the request that no parser on its path (the command, each subcommand
    it names) knows, even as an abbreviation; the known option nearest the first of them (by
    name, without the dashes), if any is near; and the ``prog`` of the parser that takes it (the
    deepest one, for an option they all take)."""
    if not _REQUEST:
        return [], None, ""
    parser, owner = _REQUEST["parser"], {}
    for arg in [*_REQUEST["argv"], None]:
        owner |= {o: parser.prog for o in parser._option_string_actions if o.startswith("--")}
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and arg in subs[0].choices:
            parser = subs[0].choices[arg]
    unknown = [a.split("=")[0] for a in _REQUEST["argv"]
               if a.startswith("--") and not any(k.startswith(a.split("=")[0]) for k in owner)]
    names = {k[2:]: k for k in owner}
    near = difflib.get_close_matches(unknown[0][2:], list(names), n=1, cutoff=0.6) if unknown else []
    return (unknown, names[near[0]], owner[names[near[0]]]) if near else (unknown, None, parser.prog)


def _user_errors() -> tuple[type[BaseException], ...]:
    """What counts as a user error: a mistake in the request, the files or the environment named."""
    import yaml

    return (UserError, ValueError, TypeError, KeyError, FileNotFoundError, FileExistsError, IsADirectoryError,
            NotADirectoryError, PermissionError, ConnectionError, yaml.YAMLError)


def _one_line(e: BaseException) -> str:
    """The error's message on one line, with the file position of a YAML error."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        m = e.problem_mark
        text = f"{m.name}, line {m.line + 1}, column {m.column + 1}: {e.context + ': ' if e.context else ''}{e.problem}"
    elif isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}"
    elif isinstance(e, KeyError) and e.args:
        text = f"key {e.args[0]!r} not found"
    else:
        text = str(e)
    return " ".join(text.split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the command; a user error prints ``kdtree: error: ...`` and returns 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        _REQUEST.update(parser=build_parser(), argv=[a for a in argv if a != "--debug"])
        args = _REQUEST["parser"].parse_args(_REQUEST["argv"])
        return args.func(args)
    except _user_errors() as e:
        if debug:
            traceback.print_exc()
        print(f"kdtree: error: {_one_line(e)}", file=sys.stderr)
        return 2
    finally:
        _REQUEST.clear()


if __name__ == "__main__":
    sys.exit(main())

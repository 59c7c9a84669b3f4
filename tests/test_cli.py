"""Fault matrix of the ``kdtree`` command, run the way users run it (``python -m kdtree.cli``).

A user error prints exactly one line, ``kdtree: error: ...``, on stderr, nothing on stdout and
no traceback, and exits with status 2; ``--debug`` adds the traceback. Every case is checked
before anything runs (no benchmark, no sweep, no report written). Help is plain text.
"""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pathlib import Path

import pytest

from kdtree import cli
from kdtree.checks import UserError

ROOT = Path(__file__).resolve().parent.parent
SHAPE = ["--batch", "8", "--nodes", "65", "--heads", "8", "--prefix", "4096"]
BAD_YAML = "name: broken\nnotebooks: [a\n  b: 2\n"


def setup_files(root):
    """A sweep file with a YAML syntax error, a run folder whose ceilings never finished, a CPU
    host's ceilings and a JSON file that holds no ceilings."""
    (root / "broken.yaml").write_text(BAD_YAML)
    run = root / "parameterized_runs" / "nocl-run"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "nocl-run", "points": {}}))
    cpu = json.loads((ROOT / "parameterized_runs" / "h200-20261202-2" / "ceilings.json").read_text())
    (root / "cpu.json").write_text(json.dumps(cpu | {"device": "CPU (test host)", "kind": "cpu"}))
    (root / "other.json").write_text(json.dumps({"device": "x"}))


USER_ERRORS = {  # name -> (arguments, words the line must hold)
    "no command": ([], "required: command"),
    "unknown command": (["frobnicate"], "invalid choice"),
    "bench without what": (["bench"], "required: what"),
    "depth 0": (["bench", "tree", "--depth", "0"], "--depth: must be an integer in 1..32"),
    "depth 40": (["bench", "tree", "--depth", "40"], "--depth: must be an integer in 1..32"),
    "depth not a number": (["bench", "tree", "--depth", "x"], "--depth"),
    "batches 0": (["bench", "tree", "--batches", "0"], "--batches: each value must be an integer >= 1"),
    "batches empty": (["bench", "tree", "--batches", ","], "--batches"),
    "batches not numbers": (["bench", "tree", "--batches", "a,b"], "--batches: expected comma-separated integers"),
    "budget 0": (["bench", "tree", "--budgets", "0,16"], "--budgets: each value must be an integer 1..1024"),
    "budget 1025": (["bench", "tree", "--budgets", "16,1025"], "--budgets: each value must be an integer 1..1024"),
    "unknown bench option": (["bench", "tree", "--deep", "3"], "unrecognized arguments: --deep (did you mean "
                                                               "--depth?) (see kdtree bench tree --help)"),
    "unknown option, nothing near": (["bench", "tree", "--frobnicate"], "unrecognized arguments: --frobnicate (see"),
    "misspelled top-level option": (["--debg", "bench"], "unrecognized arguments: --debg (did you mean --debug?) "
                                                         "(see kdtree --help)"),
    "sweep file missing": (["sweep", "missing.yaml"], "missing.yaml"),
    "sweep YAML syntax error": (["sweep", "broken.yaml"], "broken.yaml"),
    "sweep bad executor": (["sweep", "broken.yaml", "--executor", "mpi"], "--executor: invalid choice"),
    "sweep typo'd option": (["sweep", "broken.yaml", "--twinn"], "unrecognized arguments: --twinn (did you mean --twin?)"),
    "report missing run": (["report", "no-such-run"], "run 'no-such-run': no such run directory"),
    "report run without ceilings": (["report", "nocl-run"], "run nocl-run (parameterized_runs/nocl-run) has no "
                                                             "ceilings.json"),
    "compare missing baseline": (["compare", "no-such-run", "nocl-run"], "run 'no-such-run'"),
    "compare missing new run": (["compare", "nocl-run", "other-run"], "run 'other-run'"),
    "compare missing absolute run": (["compare", "/no/such/run", "nocl-run"], "(looked for /no/such/run)"),
    "plan missing run": (["plan", "no-such-run", *SHAPE], "run 'no-such-run': no such run directory"),
    "plan run without ceilings": (["plan", "nocl-run", *SHAPE], "run 'nocl-run' (parameterized_runs/nocl-run) has no "
                                                                "ceilings.json"),
    "plan CPU ceilings": (["plan", "cpu.json", *SHAPE], "ceilings: CPU (test host) is a CPU host's set"),
    "plan not ceilings": (["plan", "other.json", *SHAPE], "other.json: not a ceilings file"),
    "plan batch 0": (["plan", "cpu.json", *SHAPE, "--batch", "0"], "--batch: each value must be an integer >= 1, got '0'"),
    "plan prefix negative": (["plan", "cpu.json", *SHAPE[:-1], "-1"], "--prefix: each value must be an integer >= 0"),
    "plan without prefix": (["plan", "cpu.json", *SHAPE[:-2]], "required: --prefix"),
    "plan typo'd prefix": (["plan", "cpu.json", *SHAPE[:-2], "--prefx", "0"], "unrecognized arguments: --prefx (did you "
                                                                            "mean --prefix?) (see kdtree plan --help)"),
    "plan typo'd variant": (["plan", str(ROOT / "parameterized_runs" / "h200-20261202-2"), *SHAPE, "--variants",
                             "fused,casade"], "variants: expected some of fused, cascade, naive, got fused, casade"),
}
DEBUG_CASES = [("depth 40", "debug-first"), ("report run without ceilings", "debug-last"),
               ("sweep YAML syntax error", "debug-last")]


def kdtree_cmd(args, cwd):
    return subprocess.run([sys.executable, "-m", "kdtree.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case of this module in one pool of subprocesses (each pays the torch import once)."""
    root = tmp_path_factory.mktemp("cli")
    setup_files(root)
    jobs = {("plain", k): args for k, (args, _) in USER_ERRORS.items()}
    jobs |= {(where, k): (["--debug"] if where == "debug-first" else []) + USER_ERRORS[k][0]
             + (["--debug"] if where == "debug-last" else []) for k, where in DEBUG_CASES}
    jobs[("help", "")] = ["--help"]
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(jobs, pool.map(lambda a: kdtree_cmd(a, root), jobs.values())))
    done[("files", "after")] = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    return done


def help_paths(parser=None, prefix=()):
    """Every (sub)command path of the parser, the top level included."""
    parser = parser or cli.build_parser()
    paths = [prefix]
    for action in parser._actions:
        if action.choices and hasattr(action, "_name_parser_map"):
            for name, sub in action._name_parser_map.items():
                paths += help_paths(sub, prefix + (name,))
    return paths


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_user_error_is_one_line_and_status_2(case, runs):
    res = runs[("plain", case)]
    lines = res.stderr.splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("kdtree: error: "), res.stderr
    assert USER_ERRORS[case][1] in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_rejected_commands_wrote_nothing(runs):
    assert runs[("files", "after")] == ["broken.yaml", "cpu.json", "other.json", "parameterized_runs",
                                        "parameterized_runs/nocl-run", "parameterized_runs/nocl-run/run.json"]


@pytest.mark.parametrize("case,where", DEBUG_CASES)
def test_debug_shows_the_traceback(case, where, runs):
    res = runs[(where, case)]
    assert res.returncode == 2
    assert res.stderr.startswith("Traceback (most recent call last):"), res.stderr
    assert res.stderr.splitlines()[-1] == runs[("plain", case)].stderr.strip()


MARKUP = ("``", ":func:", ":class:", ":mod:", ":meth:", ".. ")


def test_top_level_help_is_plain_text(runs):
    res = runs[("help", "")]
    assert res.returncode == 0 and res.stderr == "" and res.stdout.startswith("usage: kdtree")
    assert "kdtree: error:" in res.stdout and "--debug" in res.stdout  # the rule is documented
    assert not [m for m in MARKUP if m in res.stdout]


def test_every_subcommand_is_reached():
    names = {" ".join(p) for p in help_paths()}
    assert {"", "bench", "bench tree", "sweep", "report", "compare", "wheelhouse", "plan"} <= names


@pytest.mark.parametrize("path", [" ".join(p) for p in help_paths()])
def test_help_is_plain_text(path, capsys):
    """Every subcommand's --help, in process (the top level runs as a command above)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([*path.split(), "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: kdtree")
    assert not [m for m in MARKUP if m in out], out


# --- the rule, in process: what is a user error and what is not ------------------------------------

@pytest.mark.parametrize("exc,line", [
    (UserError("run x is locked"), "run x is locked"),
    (ValueError("budgets: 0 is outside 1..1024\n  second line"), "budgets: 0 is outside 1..1024 second line"),
    (TypeError("scale: expected a real number"), "scale: expected a real number"),
    (KeyError("notebooks"), "key 'notebooks' not found"),
    (FileNotFoundError(2, "No such file or directory", "x.yaml"), "x.yaml: No such file or directory"),
    (ValueError(""), "ValueError"),
])
def test_user_errors_print_one_line(exc, line, monkeypatch, capsys):
    def fail(args):
        raise exc
    monkeypatch.setattr(cli, "_compare", fail)
    assert cli.main(["compare", "a", "b"]) == 2
    err = capsys.readouterr().err
    assert err == f"kdtree: error: {line}\n"


def test_yaml_error_names_file_and_line(monkeypatch, capsys):
    import yaml

    def fail(args):
        yaml.safe_load(BAD_YAML)
    monkeypatch.setattr(cli, "_compare", fail)
    assert cli.main(["compare", "a", "b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdtree: error: <unicode string>, line 3, column 4: while parsing a flow sequence: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("exc", [RuntimeError("a bug"), AssertionError("kernel differs"), ZeroDivisionError()])
def test_other_errors_keep_their_traceback(exc, monkeypatch):
    """A failure that is not the user's (a bug, a kernel mismatch) is not turned into one line."""
    def fail(args):
        raise exc
    monkeypatch.setattr(cli, "_compare", fail)
    with pytest.raises(type(exc)):
        cli.main(["compare", "a", "b"])

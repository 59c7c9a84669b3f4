"""Provenance: the commit a result records comes from git, or from the runner that copied the checkout."""
import subprocess
from pathlib import Path

from kdtree.bench.results import git_state

ROOT = Path(__file__).resolve().parents[1]


def test_git_state_reads_git(monkeypatch):
    monkeypatch.delenv("KDTREE_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    state = git_state(ROOT)
    if head.returncode != 0:                     # not a checkout (an sdist): nothing to compare
        assert state == {"git_sha": "unknown", "git_dirty": None}
        return
    assert state["git_sha"] == head.stdout.strip()
    assert isinstance(state["git_dirty"], bool)


def test_runner_sha_takes_precedence(monkeypatch):
    # A remote copy may carry a stale .git under newer files: the runner's commit wins.
    monkeypatch.setenv("KDTREE_GIT_SHA", "0123abc")
    monkeypatch.setenv("KDTREE_GIT_DIRTY", "1")
    assert git_state(ROOT) == {"git_sha": "0123abc", "git_dirty": True}
    monkeypatch.setenv("KDTREE_GIT_DIRTY", "0")
    assert git_state(ROOT)["git_dirty"] is False


def test_combined_table_with_a_mixed_column_is_written(tmp_path):
    # Two notebooks' tables may share a column name with different types (a number, a name).
    import pandas as pd

    from kdtree.bench.results import load_table, save_table

    df = pd.DataFrame({"model": [1.5, None, "kimi_k2_ep8"], "t": [1.0, 2.0, 3.0]})
    back = load_table(save_table(df, tmp_path / "results", meta={"x": 1}))
    assert list(back["model"][[0, 2]]) == ["1.5", "kimi_k2_ep8"] and pd.isna(back["model"][1])
    assert back["t"].tolist() == [1.0, 2.0, 3.0]

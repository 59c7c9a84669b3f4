"""`kdtree compare`: the join on declared keys, the between-run noise model of the flag (on
simulated runs whose noise is known, where the old within-run rule fails), the page and the
terminal summary, and two back-to-back CPU runs of this checkout."""
from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml

import kdtree.bench.compare as compare_mod
from kdtree.bench.compare import KEYS, MIN_CHANGE, compare_table, summary
from kdtree.bench.sweep import combine_results, run_sweep
from kdtree.cli import main
from workbook_run import CI_SWEEP, cpu_run


def simulated_run(true_us: np.ndarray, noise: float, spread: float, seed: int) -> pd.DataFrame:
    """One run's verify rows: each median is the true time times a between-run factor
    exp(N(0, noise)); the run's own p20-p80 spread is +-``spread`` around it."""
    rng = np.random.default_rng(seed)
    med = true_us * np.exp(rng.normal(0, noise, len(true_us)))
    n = len(true_us)
    return pd.DataFrame({"kernel": "verify_attention", "variant": np.where(np.arange(n) % 2, "fused", "naive"),
                         "q_len": np.arange(n) // 2, "prefix": 4096, "mode": "graph", "l2": "cold",
                         "median_us": med, "p20_us": med * (1 - spread), "p80_us": med * (1 + spread),
                         "check_rel": rng.random(n)})           # differs every run: not a key


def _true(n=400, seed=0) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).uniform(np.log(20), np.log(20_000), n))


def overlap_rule(t: pd.DataFrame) -> pd.Series:
    """The old flag: the two p20-p80 spreads do not overlap."""
    return (t["b_p20"] > t["a_p80"]) | (t["b_p80"] < t["a_p20"])


def test_between_run_noise_larger_than_the_spreads_flags_under_5_percent():
    true = _true()
    a, b = simulated_run(true, 0.04, 0.01, 1), simulated_run(true, 0.04, 0.01, 2)
    t = compare_table(a, b)
    assert len(t) == len(true) and t.attrs["only_a"] == t.attrs["only_b"] == 0
    assert overlap_rule(t).mean() > 0.5              # the within-run rule cries wolf on this noise
    assert (t["flag"] != "").mean() < 0.05
    assert t.attrs["sigma"]["median_us"] == pytest.approx(0.04 * 2 ** 0.5, rel=0.25)


def test_real_changes_beyond_the_noise_are_flagged_both_ways():
    true = _true()
    a, b = simulated_run(true, 0.03, 0.01, 3), simulated_run(true, 0.03, 0.01, 4)
    slow, fast = np.arange(0, 40, 2), np.arange(41, 80, 2)
    for idx, factor in ((slow, 1.6), (fast, 1 / 1.6)):
        b.loc[idx, ["median_us", "p20_us", "p80_us"]] *= factor
    t = compare_table(a, b)
    flag = t.set_index(["variant", "q_len"])["flag"]
    keys = list(zip(b["variant"], b["q_len"]))
    assert all(flag[keys[i]] == "slower" for i in slow) and all(flag[keys[i]] == "faster" for i in fast)
    others = flag.drop([keys[i] for i in (*slow, *fast)])
    assert (others != "").mean() < 0.05
    s = summary(t)
    assert (s["slower"], s["faster"]) >= (len(slow), len(fast)) and len(s["largest"]) == 5
    assert all("within noise" not in x for x in s["largest"])


def test_a_shift_of_every_point_shows_and_small_changes_do_not():
    true = _true(100)
    a = simulated_run(true, 0.005, 0.01, 5)
    b = a.copy()
    b[["median_us", "p20_us", "p80_us"]] *= 1.2 * np.exp(np.random.default_rng(6).normal(0, 0.005, (100, 1)))
    assert (compare_table(a, b)["flag"] == "slower").mean() > 0.95
    c = a.copy()
    c[["median_us", "p20_us", "p80_us"]] *= 1 + MIN_CHANGE * 0.8             # under the minimum change
    assert (compare_table(a, c)["flag"] == "").all()
    tiny = a.assign(median_us=2.0, p20_us=1.99, p80_us=2.01)
    assert (compare_table(tiny, tiny.assign(median_us=4.0, p20_us=3.99, p80_us=4.01))["flag"] == "").all()  # +2 us


def test_each_family_is_held_against_its_own_noise():
    # A quiet graph-replayed kernel beside a noisy host-timed family: the noisy one must not flag
    # on its own noise, and a 20% change of the quiet one must still flag.
    true = _true()
    a, b = simulated_run(true, 0.01, 0.005, 7), simulated_run(true, 0.01, 0.005, 8)
    noisy = np.arange(len(true)) >= 200
    for t, seed in ((a, 9), (b, 10)):
        t.loc[noisy, "mode"] = "eager"
        t.loc[noisy, ["median_us", "p20_us", "p80_us"]] *= np.exp(
            np.random.default_rng(seed).normal(0, 0.15, (int(noisy.sum()), 1)))
    changed = np.arange(0, 20)
    b.loc[changed, ["median_us", "p20_us", "p80_us"]] *= 1.2
    t = compare_table(a, b).set_index(["variant", "q_len", "mode"])
    keys = list(zip(b["variant"], b["q_len"], b["mode"]))
    assert all(t.loc[keys[i], "flag"] == "slower" for i in changed)
    assert (t.loc[[keys[i] for i in np.flatnonzero(noisy)], "flag"] != "").mean() < 0.05


def test_join_uses_declared_keys_and_matches_repeats_in_point_order():
    a = simulated_run(_true(6), 0.0, 0.01, 7).assign(point=[f"p{i}" for i in range(6)], tau=1.0)
    a.loc[3, ["variant", "q_len"]] = a.loc[2, ["variant", "q_len"]].to_numpy()     # one configuration twice
    a.loc[3, ["median_us", "p20_us", "p80_us"]] = [1e4, 0.99e4, 1.01e4]
    b = a.assign(check_rel=9.0, tau=2.0).iloc[::-1]
    t = compare_table(a, b)
    assert len(t[t["metric"] == "median_us"]) == 6 and (t[t["metric"] == "median_us"]["ratio"] == 1).all()
    assert "check_rel" not in t.columns and set(t.attrs["keys"]) <= set(KEYS)
    assert (t[t["metric"] == "tau"]["flag"] == "faster").all()               # higher is better
    with pytest.raises(ValueError, match="no point in common"):
        compare_table(a, a.assign(kernel="other"))
    with pytest.raises(ValueError, match="metrics"):
        compare_table(a.drop(columns=["median_us", "tau"]), b)


class _Tables(HTMLParser):
    """Each table's header and rows (cell texts) of a page."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None


def _ci_run(tmp_path, run_id: str):
    return run_sweep(CI_SWEEP, run_id=run_id, profile="cpu", out_root=tmp_path / "runs", progress=False)


def test_back_to_back_cpu_runs_compare_every_point_and_the_noise_model_quiets_them(tmp_path, capsys, monkeypatch):
    a = _ci_run(tmp_path, "a")
    b = _ci_run(tmp_path, "b")
    reports = tmp_path / "reports"
    assert main(["compare", str(a), str(b), "--reports", str(reports)]) == 0
    out = capsys.readouterr().out
    page = reports / "compare-a-vs-b" / "index.html"
    assert f"report: {page}" in out and "largest changes:" in out and "WARNING" not in out
    compared, faster, slower, unchanged = (int(x) for x in re.search(
        r"(\d+) points compared: (\d+) faster, (\d+) slower, (\d+) unchanged", out).groups())
    assert compared > 20 and compared == faster + slower + unchanged and "only in" not in out   # every point in both

    text = page.read_text()
    assert text.index("points compared") < text.index("Plotly.newPlot") < text.index("<table")
    p = _Tables()
    p.feed(text)
    assert p.tables
    for table in p.tables:
        head, body = table[0], table[1:]
        assert head[head.index("a"):head.index("a") + 4] == ["a", "b", "ratio b/a", "flag"]
        assert all(any(r[i] for r in body) for i in range(len(head))), f"an all-empty column in {head}"
    # The between-run noise model must quiet the plain rule (spreads, 5% and 3 us) on two runs
    # of the same code. The share it leaves is a measurement of the host, not asserted here: on
    # a quiet 2-CPU host the CPU sweep's host timings still flag 17-21% of points (heavy-tailed
    # noise of the few-repetition engine components); the rule's behaviour on controlled noise
    # is asserted on controlled noise by the simulated-run tests above.
    ta, tb = combine_results(a), combine_results(b)
    flagged = compare_table(ta, tb)["flag"].isin(["faster", "slower"]).sum()
    monkeypatch.setattr(compare_mod, "Z", 0.0)
    plain = compare_table(ta, tb)["flag"].isin(["faster", "slower"]).sum()
    assert flagged == faster + slower
    assert flagged < plain, (flagged, plain)


def test_different_devices_warn_on_terminal_and_page(tmp_path, capsys):
    run_dir, _ = cpu_run()
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    manifest = json.loads((other / "run.json").read_text())
    manifest["run_id"], manifest["metadata"]["device"] = "other", "NVIDIA H200"
    (other / "run.json").write_text(json.dumps(manifest))
    reports = tmp_path / "reports"
    assert main(["compare", str(run_dir), str(other), "--reports", str(reports)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("WARNING: the runs ran on different devices")
    assert 'class="warning"' in (reports / "compare-ci-vs-other" / "index.html").read_text()


def _tiny(path, kernel: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('results_path = ""\nceilings_path = ""\nrun_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import pandas as pd\nfrom kdtree.bench.results import save_table\n"
        f"save_table(pd.DataFrame({{'kernel': ['{kernel}'], 'median_us': [5.0], 'p20_us': [4.9], 'p80_us': [5.1]}}),"
        " results_path, meta={})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_runs_without_a_common_point_are_an_error(tmp_path, capsys):
    runs = {}
    for kernel in ("k1", "k2"):
        (tmp_path / kernel / "nb").mkdir(parents=True)
        _tiny(tmp_path / kernel / "nb" / "t.ipynb", kernel)
        spec = tmp_path / kernel / "s" / "t.yaml"
        spec.parent.mkdir()
        spec.write_text(yaml.safe_dump({"name": "t", "notebooks": [{"notebook": "nb/t.ipynb"}]}))
        runs[kernel] = run_sweep(spec, run_id=kernel, profile="cpu", progress=False)
    assert main(["compare", str(runs["k1"]), str(runs["k2"]), "--reports", str(tmp_path / "r")]) == 2
    assert "no point in common" in capsys.readouterr().err
    assert not (tmp_path / "r" / "compare-k1-vs-k2").exists()

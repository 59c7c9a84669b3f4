"""Legibility of the figures and tables, where a test can see it: one colour and marker per
variant across every chart of a run, timing mode and L2 state never shown by colour, short
legends, every reference line labelled on the line with a dash of its own, a subtitle per chart
saying what it adds, engineering formatting with units, and no all-empty table column."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from kdtree.bench import plots
from kdtree.bench.ceilings import Ceilings
from kdtree.bench.display import display_table, eng, fmt

H200 = Ceilings(device="NVIDIA H200", kind="gpu", hbm_bw=4.3e12, l2_bw=10e12, tensor_flops=780e12,
                fp32_flops=50e12, launch_eager_us=12.0, launch_graph_us=1.5, l2_bytes=60 << 20)
VERIFY = ("naive", "cascade", "fused", "fused_mma", "torch", "shiny")      # "shiny": a variant no map knows
TREE = ("gpu", "gpu_heap", "cpu_paper", "cpu_serving")


def _verify_rows() -> pd.DataFrame:
    rows = []
    for i, v in enumerate(VERIFY):
        for n in (9, 33, 129):
            for mode in ("eager", "graph"):
                for l2 in ("cold", "warm"):
                    t = (20.0 + 5 * i) * n ** 0.5 * (1.5 if mode == "eager" else 1.0)
                    flops = 2176.0 * n * 64 * 4096
                    rows.append({"kernel": "verify_attention", "variant": v, "q_len": n, "prefix": 4096, "batch": 1,
                                 "heads": 64, "mode": mode, "l2": l2, "median_us": t, "p20_us": 0.95 * t,
                                 "p80_us": 1.1 * t, "flops": flops, "intensity": 1.89 * 64 * n / (1 + i),
                                 "achieved_tflops": flops / t / 1e6, "achieved_tbs": 9.4e6 / t / 1e6})
    return pd.DataFrame(rows)


def _tree_rows() -> pd.DataFrame:
    rows = []
    for kernel in ("build", "accept", "compact"):
        for v in TREE if kernel == "build" else ("gpu",):
            modes = ("host",) if v.startswith("cpu") else ("eager", "graph")
            for b in (16, 64, 256):
                for batch in (1, 8):
                    for mode in modes:
                        t = b * batch * (3.0 if mode == "host" else 1.0) + (15.0 if mode == "eager" else 2.0)
                        rows.append({"kernel": kernel, "variant": v, "budget": b, "batch": batch, "mode": mode,
                                     "l2": "n/a" if mode == "host" else "warm", "median_us": t, "p20_us": t * 0.9,
                                     "p80_us": t * 1.1})
    return pd.DataFrame(rows)


def run_charts():
    """The charts the notebooks draw for one run, by name."""
    v, t = _verify_rows(), _tree_rows()
    gpu = t[t["mode"] != "host"]
    return {
        "verify latency": plots.latency(v, "q_len", ["variant", "mode"], "Verify time", H200, facet="l2"),
        "verify bandwidth": plots.bandwidth(v, "q_len", ["variant", "mode"], "Verify TB/s", H200, facet="l2"),
        "roofline": plots.roofline(v, H200, "Roofline"),
        "tree build": plots.latency(t[t["kernel"] == "build"], "budget", ["variant", "mode"], "Build", H200,
                                    facet="batch"),
        "dispatch": plots.dispatch_overhead(gpu, "budget", ["variant", "batch"], "Dispatch", H200, facet="kernel"),
        "ceilings": plots.ceilings_bars(H200),
    }


def _data_traces(fig):
    """Traces that draw a variant's data (not reference lines, not legend keys)."""
    return [tr for tr in fig.data if tr.legendgroup and tr.legendgroup != "key" and not (tr.meta or {}).get("reference")
            and tr.x is not None and len(tr.x) and tr.x[0] is not None]


def _base(symbol: str) -> str:
    return symbol.removesuffix("-open")


def test_each_variant_keeps_one_colour_and_marker_in_every_chart():
    seen = {}
    for name, fig in run_charts().items():
        in_chart = {}
        for tr in _data_traces(fig):
            style = (tr.marker.color, _base(tr.marker.symbol))
            assert seen.setdefault(tr.legendgroup, style) == style, f"{name}: {tr.legendgroup} changed style"
            in_chart[tr.legendgroup] = style[0]
        colours = list(in_chart.values())
        assert len(colours) == len(set(colours)), f"{name}: two variants share a colour: {in_chart}"
    assert set(VERIFY) | set(TREE) <= set(seen)
    assert plots.variant_style("shiny") == plots.variant_style("shiny")          # unknown: same every time
    assert plots.variant_style("shiny")[0] not in {plots.variant_style(v)[0] for v in VERIFY[:-1]}


def test_timing_mode_and_l2_state_change_fill_or_dash_never_colour():
    charts = run_charts()
    lat = charts["verify latency"]
    for variant in VERIFY:
        traces = [tr for tr in _data_traces(lat) if tr.legendgroup == variant]
        assert len({tr.line.color for tr in traces}) == 1
        eager = {tr.line.dash for tr in traces if tr.marker.symbol.endswith("-open")}
        graph = {tr.line.dash for tr in traces if not tr.marker.symbol.endswith("-open")}
        assert eager and graph and eager.isdisjoint(graph)             # eager hollow and dashed, graph not
    roof = charts["roofline"]
    fills = {(tr.legendgroup, tr.marker.symbol.endswith("-open")) for tr in _data_traces(roof)}
    assert {(v, True) for v in VERIFY} | {(v, False) for v in VERIFY} == fills      # warm hollow, cold filled
    assert len({tr.marker.color for tr in _data_traces(roof)}) == len(VERIFY)


def test_legends_list_each_variant_once_plus_a_short_key():
    for name, fig in run_charts().items():
        entries = [tr.name for tr in fig.data if tr.showlegend is not False]
        assert len(entries) == len(set(entries)), f"{name}: repeated legend entries {entries}"
        variants = {tr.legendgroup for tr in _data_traces(fig)}
        assert len(entries) <= len(variants) + 4, f"{name}: legend of {len(entries)} entries"
        assert fig.layout.legend.orientation == "h"


def test_every_reference_line_is_labelled_on_the_line_with_its_own_dash():
    charts = run_charts()
    total = 0
    for name, fig in charts.items():
        refs = [tr for tr in fig.data if (tr.meta or {}).get("reference")]
        notes = [(a.text, a.x, a.y, a.xref, a.yref) for a in fig.layout.annotations]
        for tr in refs:
            label = tr.meta["reference"]
            panel = tr.xaxis or "x"
            where = [n for n in notes if n[0] == label and n[3] == panel]      # in the line's own panel
            assert len(where) == 1, f"{name}: reference line {label!r} has {len(where)} labels in {panel}"
            _, x, y, xref, yref = where[0]
            log_x = fig.layout[xref.replace("x", "xaxis")].type == "log"
            log_y = fig.layout[yref.replace("y", "yaxis")].type == "log"
            xs = [math.log10(v) if log_x else v for v in tr.x]
            ys = [math.log10(v) if log_y else v for v in tr.y]
            assert min(xs) <= x <= max(xs)                              # on the line, between its ends
            s = (x - xs[0]) / (xs[1] - xs[0])
            assert y == pytest.approx(ys[0] + s * (ys[1] - ys[0]), abs=1e-9)
        by_panel = {}
        for tr in refs:
            by_panel.setdefault(tr.xaxis, []).append(tr.line.dash)
        for dashes in by_panel.values():
            assert len(dashes) == len(set(dashes)), f"{name}: two reference lines share a dash"
        total += len(refs)
    roof = {tr.meta["reference"].split()[0] for tr in charts["roofline"].data if (tr.meta or {}).get("reference")}
    assert roof == {"HBM", "L2", "tensor-core", "fp32"}
    lat = {tr.meta["reference"] for tr in charts["verify latency"].data if (tr.meta or {}).get("reference")}
    assert any(r.startswith("graph launch") for r in lat) and any(r.startswith("eager floor") for r in lat)
    assert total >= 10


def test_each_chart_says_what_it_adds_and_roofline_leaves_eager_points_out():
    charts = run_charts()
    notes = {name: fig.layout.meta["kdtree_note"] for name, fig in charts.items()}
    assert all(notes.values()) and len(set(notes.values())) == len(notes)
    for fig in charts.values():
        assert notes_in_title(fig)
    roof = charts["roofline"]
    assert "timing: graph" in roof.layout.title.text and "eager" in roof.layout.meta["kdtree_note"]


def notes_in_title(fig) -> bool:
    return fig.layout.meta["kdtree_note"] in fig.layout.title.text and "NVIDIA H200" in fig.layout.title.text


def test_engineering_formatting_and_units():
    assert [eng(87.8e-6, "s"), eng(10.4e-3, "s"), eng(1.83e12, "B/s"), eng(423e12, "FLOP/s")] == [
        "87.8 us", "10.4 ms", "1.83 TB/s", "423 TFLOP/s"]
    assert eng(999.96e-6, "s") == "1 ms" and eng(0.0, "s") == "0 s" and eng(float("nan"), "s") == ""
    assert [fmt(0.434, "%"), fmt(1.571, "x"), fmt(64.0), fmt(3719.4), fmt(None)] == ["43.4%", "1.57x", "64", "3,719", ""]
    df = pd.DataFrame({"variant": ["fused", "naive"], "median_us": [87.8, 10412.0], "achieved_tflops": [423.0, 1.0],
                       "achieved_tbs": [1.83, np.nan], "fraction": [0.5, 0.25], "empty": [np.nan, np.nan],
                       "blank": ["", ""]})
    shown = display_table(df)
    assert list(shown.columns) == ["variant", "median time", "achieved FLOP/s", "achieved B/s (minimum bytes)",
                                   "fraction of roof (%)"]                      # all-empty columns dropped
    assert shown.iloc[0].tolist() == ["fused", "87.8 us", "423 TFLOP/s", "1.83 TB/s", "50%"]
    assert shown.iloc[1].tolist() == ["naive", "10.4 ms", "1 TFLOP/s", "", "25%"]


def test_run_summary_and_diagnosis_use_engineering_formatting():
    # A kernel without FLOPs shows no FLOP rate (not "0 FLOP/s"); the diagnosis line speaks
    # ms and GB, never "9.32e+03 us" or "2.08e+04 MB".
    from kdtree.bench.models import verify_attention_cost
    from kdtree.bench.report import headline
    from kdtree.bench.roofline import classify_point

    h = headline(pd.DataFrame({"kernel": ["accept", "accept", "verify_attention"], "variant": ["gpu", "gpu", "fused"],
                               "mode": "graph", "l2": "warm", "flops": [0.0, 0.0, 1e9], "bytes_min": [1e6, 2e6, 1e6],
                               "achieved_tflops": [0.0, 0.0, 400.0], "achieved_tbs": [0.3, 0.4, 1.0],
                               "fraction": 0.5, "bound": "latency", "diagnosis": "d"}))
    shown = display_table(h).set_index("kernel")
    assert shown.loc["accept", "best FLOP/s"] == "" and shown.loc["verify_attention", "best FLOP/s"] == "400 TFLOP/s"
    cost = verify_attention_cost("naive", batch=64, nodes=65, heads=64, prefix=4096)       # tens of GB via L2
    eager = classify_point(cost, H200, 9320.0, "eager", "warm", "naive", "verify_attention")["diagnosis"]
    graph = classify_point(cost, H200, 9320.0, "graph", "warm", "naive", "verify_attention")["diagnosis"]
    assert "eager call, 9.32 ms against a host floor of 12 us" in eager
    assert " GB L2 <-> SM" in graph and not any(re.search(r"\de[+-]\d", x) for x in (eager, graph)), graph


def test_step_breakdown_reads_in_words_with_units():
    rows = [{"phase": ph, "mode": m, "decode": dec, "budget": b, "median_us": us}
            for m in ("eager", "graph") for dec, b in (("ar", 0), ("ddtree", 64))
            for ph, us in (("draft", 650.0), ("verify", 10412.0), ("step", 11062.0), ("host", 15000.0))]
    styled = plots.breakdown_table(pd.DataFrame(rows))
    t = styled.data
    assert list(t.columns) == ["phase", "greedy · eager (median time)", "greedy · graph (median time)",
                               "ddtree b=64 · eager (median time)", "ddtree b=64 · graph (median time)"]
    assert t["phase"].tolist() == ["draft (drafter forward)", "verify (target forward)", "whole step (device)",
                                   "host time to issue the step"]
    assert t.iloc[1, 1] == "10.4 ms" and t.iloc[0, 1] == "650 us"
    assert not any("/" in c for c in t.columns)
    with pytest.raises(ValueError, match="median_us"):
        plots.breakdown_table(pd.DataFrame(rows).drop(columns=["median_us"]))

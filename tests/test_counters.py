"""The Nsight Compute counter path on CPU: the raw-CSV parser on a small committed H200 export
(``tests/data/ncu_h200/counters_raw.csv``: 12 launches of ``kdtree profile``'s default points,
its columns trimmed to those the parser reads, with the calls it recorded in ``calls.json``), the join to the cost model, the comparison and
its flags, the hierarchical roofline points, and the clear errors off a GPU host."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kdtree.bench import counters
from kdtree.bench.counters import compare, join_model, read_raw_csv, roofline_points

DATA = Path(__file__).parent / "data" / "ncu_h200"
H200_L2 = 60 << 20


@pytest.fixture(scope="module")
def launches():
    return read_raw_csv(DATA / "counters_raw.csv")


@pytest.fixture(scope="module")
def calls():
    return json.loads((DATA / "calls.json").read_text())


@pytest.fixture(scope="module")
def joined(launches, calls):
    return join_model(launches, calls, H200_L2)


def test_parser_reads_every_launch_in_base_units(launches):
    assert len(launches) == 12 and list(launches["id"]) == list(range(12))
    assert list(launches["kernel_name"][:4]) == ["verify_fused_wgmma", "verify_combine", "verify_fused",
                                                 "verify_combine"]
    first = launches.iloc[0]
    assert first["duration_us"] == pytest.approx(54.848)               # 54,848 ns in the export
    assert first["dram_read"] == 7_246_080 and first["dram_write"] == 106_752
    assert first["l2_read"] == 1_695_857 * 32                          # sectors -> bytes
    assert first["registers"] == 230 and first["smem_bytes"] == 231_168
    assert 1000 < first["sm_clock_mhz"] < 2000                          # clocks left alone, sampled by ncu
    assert 0 < first["occupancy_pct"] < 100


def test_tensor_ops_count_flops(launches):
    """On the mma.sync kernel the bf16 tensor-op count equals 4096 FLOPs per HMMA.16816."""
    mma = launches[launches["kernel_name"] == "verify_fused"].iloc[0]
    assert mma["tensor_flops"] == pytest.approx(mma["hmma_inst"] * counters.HMMA_FLOPS)
    assert (launches.loc[launches["kernel_name"] == "verify_combine", "tensor_flops"] == 0).all()


def test_parser_converts_units_and_rejects_other_text(tmp_path):
    assert counters._to_base(5, "ns") == pytest.approx(5e-9)
    assert counters._to_base(2, "Kbyte") == 2000 and counters._to_base(1.5, "Ghz") == 1.5e9
    assert counters._to_base(2, "cycle/nsecond") == pytest.approx(2e9)
    assert counters._to_base(7, "register/thread") == 7
    with pytest.raises(ValueError, match="Kernel Name"):
        read_raw_csv("==PROF== Connected to process\nsome text output\n")
    # an export without the units row still parses (durations in ns)
    lines = (DATA / "counters_raw.csv").read_text().splitlines()
    no_units = read_raw_csv("\n".join([lines[0]] + lines[2:]))
    assert no_units["duration_us"].iloc[0] == pytest.approx(54.848)
    assert no_units["dram_read"].iloc[0] == 7_246_080


def test_join_assigns_launches_to_calls_by_the_model(joined, calls):
    assert len(joined) == 12 and joined["call"].nunique() == len(calls)
    fused = joined[(joined["variant"] == "fused") & (joined["kernel"] == "verify_attention")]
    assert list(fused["kernel_name"]) == ["verify_fused_wgmma", "verify_combine"]
    casc = joined[joined["variant"] == "cascade"]
    assert list(casc["launch"]) == [0, 1, 2] and list(casc["kernel_name"])[-1] == "verify_combine"


def test_join_refuses_launches_that_do_not_match(launches, calls):
    with pytest.raises(ValueError, match="expects 'verify_fused_wgmma'"):
        join_model(launches.iloc[1:], calls, H200_L2)
    with pytest.raises(ValueError, match="left over"):
        join_model(launches, calls[:-1], H200_L2)
    with pytest.raises(ValueError, match="expects more"):
        join_model(launches.iloc[:-1], calls, H200_L2)


def test_model_meets_the_h200_counters_on_verify_attention(joined):
    """The targets on the committed export: DRAM bytes within 10%, tensor FLOPs within 5%."""
    t = compare(joined, per_launch=False)
    verify = t[t["kernel"] == "verify_attention"]
    assert set(verify["variant"]) == {"fused", "fused_mma", "cascade", "naive"}
    dram = verify[verify["figure"] == "dram_bytes"].set_index("variant")
    assert (dram["flag"] == "").all() and dram["ratio"].between(0.9, 1.1).all()
    flops = verify[verify["figure"] == "tensor_flops"].set_index("variant")
    assert set(flops.index) == {"fused", "fused_mma", "cascade"}          # naive runs on the FMA units
    assert (flops["flag"] == "").all() and flops["ratio"].between(0.95, 1.05).all()


def test_flags_say_where_and_why_the_model_misses(joined):
    t = compare(joined)
    # the tree kernels read 2.8-3.3x their ~40 KB of data from DRAM: their own code after the
    # cache flush; under the floor a ratio is not judged, and the note says why
    tree = t[(t["kernel"] == "build_tree") & (t["figure"] == "dram_bytes") & (t["launch"] == "all")]
    assert (tree["ratio"] > 2).all() and (tree["flag"] == "").all()
    assert tree["note"].str.contains("not judged").all() and tree["note"].str.contains("code").all()
    l2 = t[(t["variant"] == "naive") & (t["figure"] == "l2_served")].iloc[0]
    assert l2["target"] == False and l2["level"] == "L2"  # noqa: E712
    assert "l2_read" not in set(t["figure"])      # this export predates the SM-side metric
    per = t[(t["variant"] == "fused") & (t["kernel"] == "verify_attention") & (t["launch"] != "all")]
    assert set(per["kernel_name"]) == {"verify_fused_wgmma", "verify_combine"}
    with pytest.raises(ValueError, match="join_model"):
        compare(pd.DataFrame({"x": [1]}))


def test_roofline_points_one_per_call_and_level(joined):
    r = roofline_points(joined)
    assert len(r) == 2 * joined["call"].nunique() and set(r["level"]) == {"DRAM", "L2"}
    fused = r[(r["variant"] == "fused") & (r["kernel"] == "verify_attention")].set_index("level")
    assert fused.loc["L2", "intensity"] < fused.loc["DRAM", "intensity"]     # more bytes reach the L2
    assert fused.loc["DRAM", "achieved_tflops"] == pytest.approx(
        fused.loc["DRAM", "flops"] / (fused.loc["DRAM", "duration_us"] * 1e-6) / 1e12)


def test_points_are_checked_and_profile_needs_a_gpu(tmp_path):
    pts = counters.default_points()
    assert {p["kernel"] for p in pts} == {"verify_attention", "build_tree", "accept_tree", "compact_kv"}
    assert {p["variant"] for p in pts if p["kernel"] == "build_tree"} == {"parallel", "heap"}
    with pytest.raises(ValueError, match="variant"):
        counters._check_point({"kernel": "build_tree", "variant": "quantum"})
    with pytest.raises(ValueError, match="not profiled"):
        counters._check_point({"kernel": "matmul", "variant": "x"})
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            counters.profile(pts, tmp_path)


def test_an_export_is_joined_again_from_its_sources(tmp_path, joined):
    again = counters.load_export(DATA, H200_L2)
    assert again[["kernel_name", "dram_read", "model_dram_read"]].equals(joined[["kernel_name", "dram_read",
                                                                                "model_dram_read"]])
    with pytest.raises(ValueError, match="no counters_raw.csv"):
        counters.load_export(tmp_path)
    (tmp_path / "counters_raw.csv").write_text((DATA / "counters_raw.csv").read_text())
    with pytest.raises(ValueError, match="no calls.json"):
        counters.load_export(tmp_path)


def test_diagnosis_carries_the_counters_of_a_profiled_point(joined):
    from kdtree.bench import roofline
    from test_models import H200

    timed = pd.DataFrame([{"kernel": "verify_attention", "variant": "fused", "q_len": 33, "prefix": 4096, "batch": 1,
                           "heads": 64, "mode": "graph", "l2": "cold", "median_us": 70.0},
                          {"kernel": "verify_attention", "variant": "fused", "q_len": 65, "prefix": 4096, "batch": 1,
                           "heads": 64, "mode": "graph", "l2": "cold", "median_us": 90.0},
                          {"kernel": "build", "variant": "gpu_heap", "budget": 64, "batch": 8, "depth": 15, "topk": 64,
                           "mode": "graph", "l2": "warm", "median_us": 50.0}])
    run = pd.concat([timed, compare(joined)], ignore_index=True)     # a run's combined table
    out = roofline.classify(run, H200)
    assert "counters (ncu, L2 flushed): DRAM 24.7 MB = 1.01x the model" in out.loc[0, "diagnosis"]
    assert "tensor 19.1 GFLOP = 1.00x the model" in out.loc[0, "diagnosis"]
    assert "counters" not in out.loc[1, "diagnosis"]                  # not profiled
    assert "DRAM 0.118 MB = 3.05x the model (not judged under 256 KB: code fetch)" in out.loc[2, "diagnosis"]
    assert "memory roofs from the counters" in out.loc[0, "diagnosis"]
    assert "memory roofs from the model" in out.loc[1, "diagnosis"]
    assert out.loc[3:, "bound"].isna().all()                          # counter rows are not timed points


# ---- the L2 / DRAM check export (tests/data/ncu_h200_l2: 6 verify points, with the SM-side L2 reads) ----

@pytest.fixture(scope="module")
def l2_check():
    return compare(counters.load_export(DATA.with_name("ncu_h200_l2"), H200_L2), per_launch=False)


def test_sm_side_l2_reads_are_what_the_model_says_the_code_moves(l2_check):
    """l1tex__m_xbar2l1tex_read_bytes (every block's own loads) against the modelled L2 -> SM
    reads: Q tiles once per split, KV once per row tile, the naive kernel's L1 sharing."""
    r = l2_check[l2_check["figure"] == "l2_read"]
    assert len(r) == 6 and (r["flag"] == "").all() and r["ratio"].between(0.99, 1.01).all()


def test_l2_slices_serve_between_the_merged_floor_and_the_sm_bytes(l2_check):
    r = l2_check[(l2_check["figure"] == "l2_served") & (l2_check["variant"] == "fused")]
    assert (r["ratio"] < 0.85).all() and (r["flag"] == "").all() and r["note"].str.contains("coalescer").all()


def test_dram_model_meets_the_counters_where_it_can_and_says_why_where_not(l2_check):
    d = l2_check[l2_check["figure"] == "dram_bytes"].set_index(["variant", "batch", "q_len"])
    assert d.loc[("fused", 4, 129), "ratio"] == pytest.approx(1.0, abs=0.02)      # waves re-read KV ranges
    assert d.loc[("cascade", 1, 257), "ratio"] == pytest.approx(1.0, abs=0.1)     # spills beyond the L2 copies
    n257 = d.loc[("fused", 1, 257)]
    assert n257["flag"] == "over" and "written back to DRAM" in n257["note"]
    ok = d.drop(index=[("fused", 1, 257)])
    assert (ok["flag"] == "").all() and "model" not in l2_check.columns and "modelled" in l2_check.columns


@pytest.mark.parametrize("arg, message", [
    ('[{"kernel": "nope"}]', "points: kernel 'nope' is not profiled"),
    ('[{"kernel": "verify_attention", "variant": "fusd", "batch": 1, "q_len": 33, "heads": 64, "prefix": 4096}]',
     "variant 'fusd'"),
    ('{"kernel": "verify_attention"}', "points: expected a list of point objects"),
    ("[1, 2", "--points: not a JSON list of points"),
    ("missing_points.json", "missing_points.json: No such file or directory"),
])
def test_profile_cli_refuses_bad_points_in_one_line(arg, message, capsys, tmp_path, monkeypatch):
    """`kdtree profile --points` takes a file or the JSON list itself; a bad one is one line naming
    what is wrong, before anything runs (no GPU needed to be told)."""
    from kdtree.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--out", str(tmp_path / "out"), "--points", arg]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdtree: error: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_profile_cli_reads_points_from_a_file(tmp_path, capsys, monkeypatch):
    """A points file is read and checked; on a machine without a GPU the run then stops at the GPU check."""
    from kdtree.cli import main

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    f = tmp_path / "points.json"
    f.write_text(json.dumps([{"kernel": "verify_attention", "variant": "fused", "batch": 1, "q_len": 33, "heads": 8,
                              "prefix": 64}]))
    assert main(["profile", "--out", str(tmp_path / "out"), "--points", str(f)]) == 1
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_the_partials_dtype_a_call_records_picks_its_model():
    """Calls recorded before the partials went bf16 name no dtype and get the fp32 model (the
    committed exports above); the bf16 kernels' own export (an H200 at d16c7a4, `fused` at four
    points) meets the bf16 model's DRAM reads launch by launch, where the fp32 one would double
    the combine's."""
    run = Path(__file__).parent.parent / "results" / "counters_h200" / "d16c7a4" / "counters.csv"
    d = pd.read_csv(run)
    assert set(d["kernel_name"]) == {"verify_fused_pair", "verify_combine"}
    cols = ["kernel", "variant", "batch", "q_len", "heads", "prefix", "tree_visible", "splits", "layout", "impl"]
    for call_id, launches in d.groupby("call"):
        call = launches.iloc[0][cols].to_dict()
        bf16 = counters.model_launches(call | {"partials": "bfloat16"}, H200_L2)
        fp32 = counters.model_launches(call, H200_L2)                     # no dtype recorded: fp32
        assert [m["model_kernel"] for m in bf16] == list(launches["kernel_name"])
        for m, m32, (_, measured) in zip(bf16, fp32, launches.iterrows()):
            assert m["model_dram_read"] == pytest.approx(measured["dram_read"], rel=0.05)
            if m["model_kernel"] == "verify_combine":
                assert m32["model_dram_read"] > 1.9 * measured["dram_read"]


# ---- how busy a call kept the tensor pipe, the L2 and the crossbar (percentages ncu reports) ----

def _with_busy(tmp_path, l2, xbar):
    """The committed export with the L2 and crossbar percentages added to every launch (the
    committed export predates them; the metric names are the ones ``ncu --query-metrics`` offers)."""
    import csv
    import io

    lines = [ln for ln in (DATA / "counters_raw.csv").read_text().splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    rows[0] += ["lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
                "l1tex__m_xbar2l1tex_read_bytes.sum.pct_of_peak_sustained_elapsed"]
    rows[1] += ["%", "%"]
    for i, r in enumerate(rows[2:]):
        r += [f"{l2 + i:.2f}", f"{xbar + i:.2f}"]
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL).writerows(rows)
    path = tmp_path / "counters_raw.csv"
    path.write_text(buf.getvalue())
    return path


def test_a_call_carries_its_units_busy_shares_weighted_by_launch_time(tmp_path, calls):
    launches = read_raw_csv(_with_busy(tmp_path, 20.0, 10.0))
    assert list(launches["l2_pct_peak"][:2]) == [20.0, 21.0] and launches["xbar_pct_peak"].iloc[3] == 13.0
    joined = join_model(launches, calls, H200_L2)
    table = compare(joined)
    call0 = table[(table["launch"] == "all") & (table["call"] == 0)].iloc[0]
    first = joined[joined["call"] == 0]
    w = first["duration_us"]
    assert call0["l2_pct_peak"] == pytest.approx((first["l2_pct_peak"] * w).sum() / w.sum())
    assert min(first["l2_pct_peak"]) < call0["l2_pct_peak"] < max(first["l2_pct_peak"])   # two launches


@pytest.mark.parametrize("tensor, l2, xbar, verdict", [
    (57.0, 19.0, 14.0, "none saturated, so the call waits on latency (loads asked for late, handoffs)"),
    (60.0, 85.0, 30.0, "the L2 path near saturation (bandwidth-bound)"),
    (60.0, 40.0, 82.0, "the L2 path near saturation (bandwidth-bound)"),
    (91.0, 40.0, 30.0, "the tensor pipe near saturation (compute-bound)"),
])
def test_the_busy_shares_read_as_the_unit_that_binds(tensor, l2, xbar, verdict):
    text = counters.busy_reading({"hmma_active_pct": tensor, "l2_pct_peak": l2, "xbar_pct_peak": xbar})
    assert text.startswith(f"tensor pipe active {tensor:.0f}% of active cycles, L2 {l2:.0f}% and L2 -> SM "
                           f"crossbar {xbar:.0f}% of their peaks: ")
    assert text.endswith(verdict)
    assert counters.busy_reading({"hmma_active_pct": tensor, "l2_pct_peak": l2}) == ""   # one missing: no reading


def test_the_roofline_diagnosis_says_what_the_busy_shares_read(tmp_path, calls):
    """A profiled point's diagnosis ends with the reading where the export has the percentages, and
    stays as it was where it does not (the committed export)."""
    joined = join_model(read_raw_csv(_with_busy(tmp_path, 20.0, 10.0)), calls, H200_L2)
    notes = counters.counter_notes(compare(joined))
    old = counters.counter_notes(compare(join_model(read_raw_csv(DATA / "counters_raw.csv"), calls, H200_L2)))
    assert notes.keys() == old.keys()
    for key, text in notes.items():
        assert text.startswith(old[key] + "; tensor pipe active ")
        assert "of their peaks: " in text and "of their peaks" not in old[key]

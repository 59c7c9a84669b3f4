"""scripts/trace_attention.py's reading of committed H200 traces of the `tma` verify kernel (the
in-kernel event trace of cuda/attention_trace.cuh), before and after the masking fix: the
records parse into each role's tile loop, and the intervals say what the perf log says they do."""
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACE = runpy.run_path(str(ROOT / "scripts" / "trace_attention.py"))
RUNS = ROOT / "results" / "verify_attention_trace_h200"
SHAPE = "trace_tma_16_33_64_16384.npz"   # B = 16, N = 33, H = 64, P = 16384: one split of 257 tiles


def _load(which):
    data = np.load(RUNS / which / SHAPE)
    return TRACE["parse_records"](data["raw"]), float(data["mhz"])


def test_records_parse_into_each_roles_tile_loop():
    """Every traced block's producer issues each tile once, in order, after the stage is free; the
    watcher sees each tile land after it was issued; each consumer thread's clock never runs back."""
    blocks, _ = _load("after_mask_fix")
    assert len(blocks) == TRACE["BLOCKS"]
    for roles in blocks:
        issued = [(c, t) for c, ev, t in roles["producer"] if ev == "tma_issued"]
        assert [t for _, t in issued] == list(range(257))
        landed = {t: c for c, ev, t in roles["watcher"] if ev == "landed"}
        assert sorted(landed) == list(range(257))
        assert all(landed[t] > c for c, t in issued)
        for role in ("wg0", "wg1"):
            clocks = [c for c, _, _ in roles[role]]
            assert clocks == sorted(clocks) and roles[role][-1][1] == "end"
            owned = {t for _, ev, t in roles[role] if ev == "s_done"}
            assert owned == set(range(int(role[-1]), 257, 2))   # tile i is owned by warpgroup i & 1


def test_the_masking_step_lost_half_the_tile_before_the_fix():
    """Before the fix the owner's scale-mask-max step took about half of a ~2.5 us tile; after it,
    a tenth of a microsecond, and the tile period shrank by about the difference."""
    key = "owner: S done -> masked (scale, mask, row max)"
    before = TRACE["summary"](*_load("before_mask_fix"), "tma")
    after = TRACE["summary"](*_load("after_mask_fix"), "tma")
    period = "tile period (landed i -> landed i+1)"
    assert np.median(before[key]) > 1.0 and np.median(after[key]) < 0.2
    assert 2.2 < np.median(before[period]) < 2.8 and np.median(after[period]) < 2.1
    saved = np.median(before[period]) - np.median(after[period])
    assert 0.3 < saved < np.median(before[key])
    assert all(v.size > 100 for v in after.values())


PAIR = RUNS / "pair_v8"   # the pair kernel (v8), B,N,H,P = 16,33,64,1024 / 16,33,64,4096 / 1,33,64,4096


def _tail_us(name):
    """Per traced block of a pair trace: its last P V done to its end (us)."""
    data = np.load(PAIR / name)
    tails = []
    for roles in TRACE["parse_records"](data["raw"]):
        recs = [r for role in ("wg0", "wg1") for r in roles[role]]
        tails.append((max(c for c, ev, _ in recs if ev == "end") - max(c for c, ev, _ in recs if ev == "pv_done"))
                     / float(data["mhz"]))
    return tails


def test_pair_traces_parse_and_bf16_rows_end_later_than_fp32_partials():
    """Each warpgroup's records of the committed pair traces start with its start record, end with
    its end record and never run back; and the blocks that write 64 KB of bf16 rows (one split)
    end later after their last P V than the blocks that write 128 KB of fp32 partials (B = 1, four
    splits): the 4-byte stores the 16-byte output stores replaced (docs/perf_log.md)."""
    for name in ("trace_pair_16_33_64_1024.npz", "trace_pair_16_33_64_4096.npz", "trace_pair_1_33_64_4096.npz"):
        for roles in TRACE["parse_records"](np.load(PAIR / name)["raw"]):
            for role in ("wg0", "wg1"):
                clocks = [c for c, _, _ in roles[role]]
                assert clocks == sorted(clocks)
                assert roles[role][0][1] == "start" and roles[role][-1][1] == "end"
    fp32 = np.median(_tail_us("trace_pair_1_33_64_4096.npz"))
    assert all(np.median(_tail_us(n)) > 1.2 * fp32 for n in ("trace_pair_16_33_64_1024.npz", "trace_pair_16_33_64_4096.npz"))


ENTRY = RUNS / "pair_entry_0f12ac9"   # the pair kernel with its entry record (a globaltimer stamp at its first instruction)


def test_the_timeline_counts_tiles_not_timestamps():
    """Block 0 of B = 1, N = 33, H = 64, P = 4096 in four splits holds 17 of the 65 KV tiles; its
    timeline is around tile 8, and the entry and start stamps (whose tile field is the globaltimer)
    neither count as tiles nor appear among them. Each warpgroup's entry precedes its start."""
    data = np.load(ENTRY / "trace_pair_1_33_64_4096.npz")
    blocks = TRACE["parse_records"](data["raw"])
    lines = TRACE["timeline"](blocks[0], float(data["mhz"]))
    assert lines[0].startswith("  block 0, tiles 7..9 of 17 ")
    assert len(lines) > 20 and all(line.split()[-1] in ("7", "8", "9") for line in lines[1:])
    for roles in blocks:
        for role in ("wg0", "wg1"):
            assert [ev for _, ev, _ in roles[role][:2]] == ["entry", "start"]


PERF_TABLES = runpy.run_path(str(ROOT / "scripts" / "perf_tables.py"))
MERGE = ROOT / "results" / "attention_ab_h200" / "merge_1b74b11"


def test_the_merge_trace_walks_every_step_in_order_and_sums_to_the_tail():
    """The in-kernel merge's step records (branch wip/split-merge) in each traced block of B = 1,
    N = 33, H = 64, P = 4096: all five steps, in their order, every interval positive, and the
    steps' medians add up to the block's tail (last P V done -> end) within the blocks' spread."""
    table = PERF_TABLES["merge_trace"](str(MERGE / "trace_pair_1_33_64_4096.npz"))
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and " -> " in line]
    steps = [r[0][2:] for r in rows]
    names = ["last P V done"] + list(PERF_TABLES["MERGE_STEPS"].values()) + ["end"]
    assert steps == [f"{a} -> {b}" for a, b in zip(names, names[1:])]
    medians = [float(r[1]) for r in rows]
    assert all(m > 0 for m in medians)
    data = np.load(MERGE / "trace_pair_1_33_64_4096.npz")
    tails = []
    for roles in TRACE["parse_records"](data["raw"]):
        recs = roles["wg0"]
        tails.append((max(c for c, ev, _ in recs if ev == "end") - max(c for c, ev, _ in recs if ev == "pv_done"))
                     / float(data["mhz"]))
    assert min(tails) - 0.5 <= sum(medians) <= max(tails) + 0.5


def test_split_cost_table_is_the_runs_csv():
    """perf_tables split-cost: one row per shape of the committed run, the call minus the split
    launch and its share of the call from the same row."""
    import pandas as pd

    run = ROOT / "results" / "split_cost_h200" / "cf100bc" / "split_cost.csv"
    d = pd.read_csv(run)
    rows = [line for line in PERF_TABLES["split_cost"](str(run)).splitlines() if line.startswith("| 1,")
            or line.startswith("| 8,")]
    assert len(rows) == len(d)
    for line, r in zip(rows, d.itertuples()):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[5]) == round(r.whole_us - r.split_us, 1)
        assert cells[6] == f"{(r.whole_us - r.split_us) / r.whole_us:.0%}"


COLD = ROOT / "results" / "verify_attention_trace_h200" / "code_cold_a2e2347"


def _first_pairs(which):
    table = PERF_TABLES["first_pairs"](str(COLD / which / "trace_pair_1_33_64_4096.npz"))
    rows = [line.strip("|").split("|") for line in table.splitlines() if line[:3] in {f"| {j}" for j in range(4)}]
    return [[float(c.split("[")[0]) for c in r[1:]] for r in rows]


def test_first_pairs_show_the_cold_code_stall_and_its_end():
    """perf_tables first-pairs on the committed B = 1, N = 33 traces: before a2e2347 the first pair's
    rescale (no memory access) took several times a later pair's after the read flush, not with the
    code warm; after a2e2347 the first pair is as fast as the later ones with the code cold."""
    cold, warm, after = _first_pairs("before/read"), _first_pairs("before/none"), _first_pairs("after/read")
    assert len(cold) == len(warm) == len(after) == 4
    later = max(r[0] for r in cold[1:])
    assert cold[0][0] > 3 * later and cold[0][2] > 2 * max(r[2] for r in cold[1:])
    assert warm[0][0] < 2 * later and after[0][0] < 2 * later
    assert after[0][2] < 1.2 * max(r[2] for r in after[1:])


def test_first_pairs_refuses_traces_without_the_rescale_marks():
    import pytest

    with pytest.raises(SystemExit, match="rescale marks"):
        PERF_TABLES["first_pairs"](str(RUNS / "pair_entry_0f12ac9" / "trace_pair_1_33_64_4096.npz"))


def test_grid_diff_matches_each_configuration_shape_by_shape():
    """perf_tables grid-diff on two committed grids: one row per configuration both ran, its shape
    count and median ratio recomputed from the parquets."""
    import pandas as pd

    old, new = (ROOT / "results" / "verify_table_h200" / c for c in ("b7b0c86", "a2e2347"))
    table = PERF_TABLES["grid_diff"](str(old), str(new))
    a, b = (pd.read_parquet(next(p.glob("*.parquet"))) for p in (old, new))
    rows = {r[0].strip(" `"): r[1:] for r in (line.strip("|").split("|") for line in table.splitlines()
                                              if line.startswith("| `"))}
    assert set(rows) == set(a.config) & set(b.config)
    for cfg, cells in rows.items():
        m = a[a.config == cfg].merge(b[b.config == cfg], on=["B", "N", "H", "P"])
        m = m[m.us_x.notna() & m.us_y.notna()]
        assert int(cells[0]) == len(m)
        assert cells[1].split("/")[1].strip() == f"{(m.us_y / m.us_x).median():.2f}"


def test_verify_grid_counts_each_bar_at_the_points_own_clock_too():
    """perf_tables verify-grid on a committed grid that did not record the bf16 probe's clock: the
    caption says the run's highest sampled clock stands in for it; a point's fraction at its own
    clock (taken where the clock ran 3% or more below) is never below its plain fraction, so each
    bf16 group passes at least as many points at its clock; the counts and the points that pass
    only at their clock are recomputed from the parquet."""
    import pandas as pd

    run = ROOT / "results" / "verify_table_h200" / "a2e2347"
    table = PERF_TABLES["verify_grid"](str(run))
    assert "not recorded in this run, taken as its highest sampled clock, 1980 MHz" in table
    d = pd.read_parquet(next(run.glob("*.parquet")))
    f = d[(d.config == "fused") & (d.H == 64) & ((d.B >= 4) | (d.N >= 129) | (d.P >= 16384))]
    row = next(line for line in table.splitlines() if line.startswith("| H = 64, B >= 4")).strip("|").split("|")
    plain, at_clock = int(row[3]), int(row[5])
    assert plain == int((f.frac_bf16 >= 0.80).sum())
    ratio = f.sm_clock_mhz / 1980
    assert at_clock == int((f.frac_bf16 / ratio.where(ratio < 0.97, 1.0) >= 0.80).sum()) and at_clock >= plain
    bf16_rows = [line.strip("|").split("|") for line in table.splitlines() if "of bf16 |" in line]
    assert len(bf16_rows) == 3 and all(int(r[5]) >= int(r[3]) for r in bf16_rows)
    assert "| - |" in next(line for line in table.splitlines() if "of HBM" in line)
    short, split, one = (int(n) for n in re.search(r"clock: (\d+) at P <= 4096, (\d+) at longer prefixes run in KV "
                                                    r"splits, (\d+) at longer prefixes in one launch", table).groups())
    miss = f[f.frac_bf16 / ratio.where(ratio < 0.97, 1.0) < 0.80]
    assert short + split + one == len(f) - at_clock and short == int((miss.P <= 4096).sum())
    assert split == int(((miss.P > 4096) & (miss.splits > 1)).sum())
    gained = f[(f.frac_bf16 < 0.80) & (f.frac_bf16 / ratio.where(ratio < 0.97, 1.0) >= 0.80)]
    listed = re.findall(r"B=(\d+) N=(\d+) P=(\d+) at (\d+) MHz", table)
    assert len(listed) == at_clock - plain == len(gained)
    assert {(int(b), int(n), int(p)) for b, n, p, _ in listed} == set(zip(gained.B, gained.N, gained.P))


def test_counters_table_reads_the_csv_where_the_parquet_did_not_come_back(tmp_path):
    """A device call may bring back only ``counters.csv``: the table from it is the one the parquet
    gives (a committed run that has both), apart from the folder it names."""
    run = ROOT / "results" / "counters_h200" / "d22219d"
    for name in ("counters.csv", "counters.meta.json"):
        (tmp_path / name).write_bytes((run / name).read_bytes())
    from_csv = PERF_TABLES["counters"](str(tmp_path))
    assert from_csv.replace(str(tmp_path), "RUN") == PERF_TABLES["counters"](str(run)).replace(str(run), "RUN")
    rows = [line for line in from_csv.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len((run / "counters.csv").read_text().splitlines()) - 1


def test_counters_table_adds_the_busy_shares_where_the_profile_has_them(tmp_path):
    """A profile with the L2's and the crossbar's percentages gets two more columns, with each
    launch's values; the committed profile (without them) keeps its nine."""
    import pandas as pd

    run = ROOT / "results" / "counters_h200" / "d22219d"
    d = pd.read_csv(run / "counters.csv")
    d["l2_pct_peak"], d["xbar_pct_peak"] = 10.0 + d.index, 50.0 + d.index
    d.to_csv(tmp_path / "counters.csv", index=False)
    (tmp_path / "counters.meta.json").write_bytes((run / "counters.meta.json").read_bytes())
    rows = [ln for ln in PERF_TABLES["counters"](str(tmp_path)).splitlines() if ln.startswith("|")]
    assert rows[0].endswith("| L2 (% of peak) | L2 -> SM crossbar (% of peak) |")
    assert all(r.count("|") == 12 for r in rows)
    assert rows[3].endswith("| 11.0% | 51.0% |")                       # the second launch
    old = [ln for ln in PERF_TABLES["counters"](str(run)).splitlines() if ln.startswith("|")]
    assert all(r.count("|") == 10 for r in old)


def test_the_pair_kernel_waits_on_its_next_tiles_second_half():
    """The v8 pair kernel at B = 1, N = 33, H = 64, P = 4096 (H100 trace at 47246ac): each pair's
    tiles are loaded again only after the pair before has read them, so the warpgroup computing
    the next S waits for the last boxes of its tile (its first box already seen) several times as
    long as that S then takes, wg1 for a quarter of the pair period (docs/perf_log.md, session 26:
    what v9's read-out order is meant to hide)."""
    npz = ROOT / "results" / "verify_attention_trace_h100" / "pair_47246ac" / "trace_pair_1_33_64_4096.npz"
    data = np.load(npz)
    s = TRACE["summary"](TRACE["parse_records"](data["raw"]), float(data["mhz"]), "pair")
    period = np.median(s["pair period (S_A done -> next S_A done)"])
    for wait, compute in (("wg0: S_A first box seen -> last box seen", "wg0: S_A issued (boxes waited) -> done"),
                          ("wg1: next S_B first box seen -> last box seen", "wg1: next S_B issued -> done")):
        assert np.median(s[wait]) > 4 * np.median(s[compute])
    assert np.median(s["wg1: next S_B first box seen -> last box seen"]) > 0.2 * period
    table = PERF_TABLES["pair_steady"](str(npz))   # the perf log's table: the same medians
    row = next(line for line in table.splitlines() if line.startswith("| pair period"))
    assert float(row.split(" | ")[1]) == round(period, 2)


def test_the_pair_kernel_leaves_the_l2_and_the_crossbar_mostly_idle():
    """Nsight Compute on the v10 pair kernel (H100, 0277bf4) at B = 1, N = 33 and B = 4, N = 129
    (H = 64, P = 4096): the L2 and the L2 -> SM crossbar run at under half and under a fifth of
    their peaks while the tensor pipe is idle 30-45% of the active cycles, so the tiles wait on
    load latency (each stage reloaded only after its last reader), not on bandwidth
    (docs/perf_log.md, session 27)."""
    table = PERF_TABLES["ncu_details"](str(ROOT / "results" / "ncu_h100_0277bf4"))
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table.splitlines()[4:]}
    value = lambda label: [float(v.strip(" |").split()[0]) for v in rows[label]]  # noqa: E731
    assert len(value("duration")) == 2
    assert max(value("L2 throughput (% of peak)")) < 50
    assert max(value("L2 -> SM (% of the crossbar's peak)")) < 20
    assert all(30 < 100 - v < 45 for v in value("tensor pipe active (% of active cycles)"))


EPILOGUE = ROOT / "results" / "verify_attention_trace_h100" / "epilogue_606ba82"


def test_the_epilogue_split_covers_the_blocks_end_and_the_stores_take_most_of_it():
    """trace-ends splits each block's end at the epilogue's barrier and at O's stores issued: the
    three parts add up to the whole end (medians of sums equal sums of medians only loosely, so per
    block), and at B = 16, N = 129, H = 64, P = 1024 issuing O's stores is most of it, the barrier a
    tenth of a microsecond or two (the perf log's reading)."""
    blocks = TRACE["parse_records"](np.load(EPILOGUE / "trace_pair_16_129_64_1024.npz")["raw"])
    assert len(blocks) == TRACE["BLOCKS"]
    for roles in blocks:
        clk = {}
        for recs in roles.values():
            for c, ev, _ in recs:
                clk.setdefault(ev, []).append(c)
        end, pv, sync, stored = max(clk["end"]), max(clk["pv_done"]), max(clk["epi_sync"]), max(clk["o_stored"])
        assert pv < sync < stored < end
        assert stored - sync > 0.6 * (end - pv) and sync - pv < 0.2 * (end - pv)
    table = PERF_TABLES["trace_ends"](str(EPILOGUE / "trace_pair_16_129_64_1024.npz"))
    assert "both row sums in -> O stores issued" in table and "O stores issued -> end" in table


MODES = ROOT / "results" / "mode_probe_h100" / "b7ddb06"


def test_per_call_times_follow_the_power_capped_clock_and_fused_beats_cascade_at_either():
    """The mode probe (H100, b7ddb06; docs/perf_log.md, session 30): at B = 8, N = 65, H = 8,
    P = 32768 the calls the driver held down for its power cap ran at least 3% slower than those
    at the top clock, and with calls alternating ``fused`` is faster than ``cascade`` at every
    shape and clock group, where a grid that timed them one after the other (b4cf83e) had it
    slower at all four shapes."""
    table = PERF_TABLES["mode_probe"](str(MODES / "modes.csv"))
    rows = [line.strip("| ").split(" | ") for line in table.splitlines()[4:]]
    med = lambda cell: float(cell.split(", ")[1].split()[0])  # noqa: E731
    by = {(r[0], r[1].strip("`")): r for r in rows}
    shapes = {r[0] for r in rows}
    assert len(shapes) == 4
    top, below = med(by[("8, 65, 8, 32768", "fused")][3]), med(by[("8, 65, 8, 32768", "fused")][4])
    assert below > 1.03 * top
    for shape in shapes:
        for col in (3, 4):
            assert med(by[(shape, "fused")][col]) < med(by[(shape, "cascade")][col]), shape
    import pandas as pd

    grid = pd.read_parquet(ROOT / "results" / "verify_table_h100" / "b4cf83e" / "verify_table_h100.parquet")
    us = grid.set_index(["B", "N", "H", "P", "config"]).us
    for shape in shapes:
        key = tuple(int(v) for v in shape.split(", "))
        assert us[key + ("fused",)] > us[key + ("cascade",)], shape


def test_the_h200_shard_bar_is_out_of_reach_of_64_row_tiles():
    """At every HBM-bound point of the H200 grid (b6fc776: all H = 8, N = 9, 72 query rows a
    sequence computed as two 64-row tiles) the launch's whole-wave tensor roof, padding rows
    counted at the measured dense rate, is longer than 0.80 of the measured HBM bandwidth allows:
    no kernel on those row tiles reaches the bar there, however fast its tiles (docs/perf_log.md,
    session 30). On the H100's slower HBM the roof fits under the bar at some of them."""
    h200 = PERF_TABLES["hbm_bar"](str(ROOT / "results" / "verify_table_h200" / "b6fc776"))
    rows = [line.strip("| ").split(" | ") for line in h200.splitlines()[4:] if line.startswith("| ")]
    assert len(rows) == 9 and all(r[0].split(", ")[1:3] == ["9", "8"] for r in rows)
    assert all(float(r[6]) > 1.0 for r in rows)
    assert h200.endswith("at 9 of 9 points.")
    h100 = PERF_TABLES["hbm_bar"](str(ROOT / "results" / "verify_table_h100" / "096caf5"))
    assert any(float(line.strip("| ").split(" | ")[6]) < 1.0 for line in h100.splitlines()[4:] if line.startswith("| "))


def test_the_moe_bar_at_one_token_needs_the_gemms_near_the_hbm_rate():
    """The MoE layer's 0.75-of-HBM bar against the last 05 run's stage breakdown (H200, 1da4148;
    docs/perf_log.md, session 30): met at T = 17 and 65; at T = 1, with the time outside the two
    grouped GEMMs as measured (9 us), the GEMMs would have to stream at 0.94 of HBM where they
    stream at 0.69; in session 11's run (0f96448, more time outside them) no GEMM rate could have."""
    rows = lambda run: {int(line.split(" | ")[0].strip("| ")): line.strip("| ").split(" | ")  # noqa: E731
                        for line in PERF_TABLES["moe_bar"](str(ROOT / "results" / "moe" / run)).splitlines()[4:]}
    now = rows("h200_05_1da4148")
    assert sorted(now) == [1, 17, 65] and now[17][6] == now[65][6] == "met"
    assert float(now[1][5]) < 0.75 < 0.9 < float(now[1][6]) < 1.0
    assert rows("h200_05_0f96448")[1][6].endswith("out of reach")


def test_alternating_timings_leave_fused_slower_than_cascade_only_inside_both_spreads():
    """``verify-grid`` lists the points where ``fused`` lost to ``cascade``: 7 in the H100 grid that
    timed configurations one after the other (b4cf83e), 1 in the one that alternates them
    (096caf5), and there each median lies inside the other's p20-p80 (docs/perf_log.md, session 30)."""
    def lost(run):
        last = PERF_TABLES["verify_grid"](str(ROOT / "results" / "verify_table_h100" / run)).splitlines()[-1]
        assert last.startswith("`fused` slower than `cascade`: ")
        return re.findall(r"(\d+\.\d) \((\d+\.\d)-(\d+\.\d), \d+ splits, \d+ MHz\)", last)
    assert len(lost("b4cf83e")) == 14   # 7 points, fused's and cascade's figures each
    (f, f20, f80), (c, c20, c80) = lost("096caf5")
    assert float(c20) <= float(f) <= float(c80) and float(f20) <= float(c) <= float(f80)


def test_the_tail_fit_beats_the_constants_in_use_on_the_log_it_fits():
    """``tail-fit`` on session 33's A/B log: one row per measured shape, the fitted constants on
    the search grid and different from those in use, and a fit no worse than them (rms and max
    error as printed), while ``launch_tiles`` keeps its constants after the search."""
    from kdtree import attention

    keep = (attention._BLOCK_TILES, attention._PARTIAL_TILES, attention._COMBINE_TILES)
    text = PERF_TABLES["tail_fit"](str(ROOT / "results" / "attention_ab_h100" / "tail_be0db50" / "ab.log"))
    assert (attention._BLOCK_TILES, attention._PARTIAL_TILES, attention._COMBINE_TILES) == keep
    used, fitted = (tuple(map(float, m)) for m in re.findall(r"\((\S+), (\S+), (\S+)\)", text.splitlines()[0])[:2])
    assert used == keep and fitted != used
    rows = [line for line in text.splitlines() if re.match(r"\| \d+, \d+, \d+, \d+ \|", line)]
    assert len(rows) == len(PERF_TABLES["tail_model"](str(ROOT / "results" / "attention_ab_h100" / "tail_be0db50"
                                                          / "ab.log")).splitlines()) - 4
    rms_used, rms_fit, max_used, max_fit = map(float, re.findall(r"\d+\.\d+", text.splitlines()[-1]))
    assert rms_fit <= rms_used and max_fit <= max_used


def test_the_tail_fit_reads_a_plan_ab_against_its_old_plans(tmp_path):
    """``tail-fit`` on a ``splits_ab.py`` CSV (the committed A/B of heads of fewer splits) whose
    measured ratios ``launch_tiles`` remade with constants on the search grid: each new plan is
    modelled over its old plan, not over the uniform launch, so the fit finds those constants
    with no error."""
    import pandas as pd

    from kdtree import attention

    d = pd.read_csv(ROOT / "results" / "splits_ab_h100" / "fewer_26998f2" / "splits_ab.csv")
    made = (5.0, 1.5, 12.0)

    def model(r, side):
        rt = r.B * -(-(r.N * r.H) // attention._FUSED_BM)
        return attention.launch_tiles(rt, r.P + r.N, 132, *(getattr(r, f"{side}_{k}") for k in
                                                             ("splits", "head", "tail_splits")), costs=made)
    d["new_over_old"] = [model(r, "new") / model(r, "old") for r in d.itertuples()]
    path = tmp_path / "splits_ab.csv"
    d.to_csv(path, index=False)
    text = PERF_TABLES["tail_fit"](str(path))
    fitted = tuple(map(float, re.findall(r"\((\S+), (\S+), (\S+)\)", text.splitlines()[0])[1]))
    assert fitted == made
    table = [line.split("|") for line in text.splitlines()
             if re.match(r"\| \d+, \d+, \d+, \d+ \| \d+, \d+, \d+ \|", line)]
    assert len(table) == len(d) and all(cells[5].strip() in ("+0.00", "-0.00") for cells in table)
    assert any(cells[4].strip() not in ("+0.00", "-0.00") for cells in table)   # the constants in use miss


def test_the_tail_form_finds_a_growing_combine_the_three_constants_cannot_fit(tmp_path):
    """``tail-form`` on the committed A/B of heads of fewer splits, its ratios remade with a
    combine that grows per wave of partial row sets (costs on the search grid): the four-term fit
    finds those costs with no error on that log and on all; the three constants, fitted, cannot,
    and neither can those in use."""
    import pandas as pd

    from kdtree import attention

    d = pd.read_csv(ROOT / "results" / "splits_ab_h100" / "fewer_26998f2" / "splits_ab.csv")
    made = (1.0, 0.5, 2, 5.0)

    def model(r, side):
        return attention.launch_tiles(r.B * -(-(r.N * r.H) // attention._FUSED_BM), r.P + r.N, 132,
                                      *(getattr(r, f"{side}_{k}") for k in ("splits", "head", "tail_splits")), made)
    d["new_over_old"] = [model(r, "new") / model(r, "old") for r in d.itertuples()]
    path = tmp_path / "splits_ab.csv"
    d.to_csv(path, index=False)
    text = PERF_TABLES["tail_form"](str(path))
    header = [ln for ln in text.splitlines() if ln.startswith("| log |")][0]
    assert tuple(map(float, re.findall(r"\(([^)]*)\)", header)[2].split(", "))) == made
    rows = [ln.split("|")[1:-1] for ln in text.splitlines() if ln.startswith("| `") or ln.startswith("| all |")]
    assert len(rows) == 2 and all(int(r[1]) == len(d) for r in rows)
    for _, _, used, fitted, growing in rows:
        assert float(growing) == 0.0 < float(fitted) <= float(used)


def test_the_tail_fit_finds_the_constants_a_sweep_was_made_with(tmp_path, monkeypatch):
    """``tail-fit`` on a ``tail_sweep.py`` CSV whose times ``launch_tiles`` made with constants on
    the search grid (several tail split counts a shape, the sweep's shapes and plans): it reads
    every head/tail row against its shape's uniform one and finds those constants, with no error."""
    import pandas as pd

    from kdtree import attention

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    sweep = runpy.run_path(str(ROOT / "scripts" / "tail_sweep.py"))
    made = (3.0, 1.0, 4.0)
    rows = []
    for shape in sweep["SHAPES"]:
        B, N, H, P = (int(v) for v in shape.split(","))
        plan = attention.launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=132, impl="pair")
        rt = B * -(-(N * H) // attention._FUSED_BM)
        uniform = attention.choose_splits(rt, P + N, 132, B * N * H)
        for s, head, ts in [(uniform, 0, 0)] + [(plan.splits, plan.head, plan.tail_splits + d) for d in (-1, 0, 2, 5)
                                                if plan.tail_splits + d > plan.splits]:
            rows.append(dict(B=B, N=N, H=H, P=P, splits=s, head=head, tail_splits=ts,
                             us=1.75 * attention.launch_tiles(rt, P + N, 132, s, head, ts, made)))
    path = tmp_path / "tail_sweep.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    text = PERF_TABLES["tail_fit"](str(path))
    fitted = tuple(map(float, re.findall(r"\((\S+), (\S+), (\S+)\)", text.splitlines()[0])[1]))
    assert fitted == made
    table = [line.split("|") for line in text.splitlines()
             if re.match(r"\| \d+, \d+, \d+, \d+ \| \d+, \d+, \d+ \|", line)]
    assert len(table) == sum(r["head"] > 0 for r in rows) > len(sweep["SHAPES"])
    assert all(cells[5].strip() in ("+0.00", "-0.00") for cells in table)
    # The picks: one row a shape; with the constants the times were made with, the plan picked is
    # the best one wherever that saves the threshold.
    picks = [line.split("|")[1:-1] for line in text.splitlines()
             if re.match(r"\| \d+, \d+, \d+, \d+ \| \d+, \d\.\d\d \|", line)]
    assert len(picks) == len(sweep["SHAPES"])
    saving = [(float(best.split(",")[1]), float(fit.split(",")[1])) for _, best, _, fit in picks]
    assert all(over == 1.0 for best, over in saving if best <= 1 - attention._TAIL_MIN_GAIN) and any(
        best <= 1 - attention._TAIL_MIN_GAIN for best, _ in saving)


def test_moe_read_pairs_each_pattern_with_its_contiguous_control():
    """perf_tables moe-read on the committed probe run: one row per matrix and rows a block plus
    the read probe's, each GEMM-pattern time over the contiguous time of the same block count as
    in the CSV; on the H100 the pattern costs under 7% at every block count (the weights' layout is
    not what holds the GEMMs below the read probe)."""
    import pandas as pd

    path = ROOT / "results" / "moe_read_probe_h100" / "d435fa2" / "moe_read_probe.csv"
    d = pd.read_csv(path)
    rows = [line.split("|")[1:-1] for line in PERF_TABLES["moe_read"](str(path)).splitlines()
            if re.match(r"\| (gate_up|down) \|", line)]
    assert len(rows) == (len(d) - 2) // 2 + 2   # pattern/contiguous pairs, one read-probe row per matrix
    for m, per_block, blocks, *_, ratio, _ in (r for r in rows if r[1].strip() != "read probe"):
        pair = d[d["config"].str.startswith(f"{m.strip()} ") & (d["blocks"] == int(blocks))]
        us = dict(zip(pair["config"].str.split(" ").str[1], pair["us"]))
        assert abs(float(ratio) - us["rows"] / us["contiguous"]) <= 5e-4
        assert 1.0 < float(ratio) < 1.07


def test_grid_diff_lists_the_shapes_where_fused_alone_moved():
    """perf_tables grid-diff's list of shapes where `fused` is > 2% slower while `cascade` stayed
    within 1%: every row's two ratios recomputed from the parquets meet that rule, and every shape
    that meets it is listed (b892e04 -> d435fa2: the three 26-split launches at B = 1, P = 32768)."""
    import pandas as pd

    old, new = (ROOT / "results" / "verify_table_h100" / c for c in ("b892e04", "d435fa2"))
    text = PERF_TABLES["grid_diff"](str(old), str(new))
    tail = text.split("alone slower")[1].splitlines()
    listed = {tuple(int(v) for v in line.split("|")[1].split(",")) for line in tail
              if re.match(r"\| \d+, \d+, \d+, \d+ \|", line)}
    a, b = (pd.read_parquet(next(p.glob("*.parquet"))).set_index(["config", "B", "N", "H", "P"]).us for p in (old, new))
    r = (b / a).dropna()
    want = {k for k in r["fused"].index if r["fused"][k] > 1.02 and abs(r["cascade"].get(k, 9) - 1) <= 0.01}
    assert listed == want and {(1, 33, 8, 32768), (1, 17, 16, 32768), (1, 9, 32, 32768)} <= listed


def test_rn72_intervals_read_one_blocks_handoffs():
    """rn72_intervals on a synthetic block of 8 tiles whose handoffs sit at known clocks (1 MHz:
    one clock a microsecond): each steady tile's intervals come out as laid down, tile 3's max
    step shows in ``rescaled``, and the wg1 idle gap ends at the next tile's P seen."""
    wg0, wg1 = [], []
    for i in range(8):
        t = 100 * i
        wg0 += [(t + 0, "full_wait", i), (t + 2, "landed", i), (t + 3, "s_issued", i), (t + 40, "s_done", i),
                (t + 45, "free_wait", i)]
        if i == 3:
            wg0.append((t + 50, "rescaled", i))
        wg0 += [(t + 55, "masked", i), (t + 70, "pub", i), (t + 71, "pv_issued", i), (t + 90, "pv_done", i)]
        wg1 += [(t + 72, "pub_wait", i), (t + 74, "pv_issued", i), (t + 130, "pv_done", i)]
    blocks = [{"wg0": wg0, "wg1": wg1, "producer": [], "watcher": []}]
    got = TRACE["summary"](blocks, 1.0, "rn72")
    steady = list(range(2, 6))
    assert got["rescaled"].tolist() == [float(i == 3) for i in steady]
    assert got["wg0: S^T issued -> done"].tolist() == [37.0] * 4
    assert got["wg0: O^T(i-1) done -> value boxes of i seen"].tolist() == [10.0] * 4
    assert got["wg0: masked -> P published (exp, P stores)"].tolist() == [15.0] * 4
    assert got["wg1: O^T(i) done -> P(i+1) seen (idle)"].tolist() == [42.0] * 4
    assert got["tile period (S^T issued i -> i+1)"].tolist() == [100.0] * 4


def test_rn72_stalls_split_each_warpgroups_loop_and_find_the_guarded_regions():
    """perf_tables rn72-stalls on the committed H100 source page of rn72 (B = 64, N = 9, H = 8,
    P = 16384): the sections of each warpgroup's loop add up to its total and cover nearly all the
    kernel's samples; warpgroup 1 spends most of its loop waiting for warpgroup 0's P; and the
    scale-mask step of warpgroup 0, with the guarded regions that build entered on every tile (at
    least one per S^T column), takes a fifth or more of its loop."""
    run = ROOT / "results" / "ncu_stalls_h100" / "rn72_9b1b4a4" / "rn72_source.csv.gz"
    text = PERF_TABLES["rn72_stalls"](str(run))
    head = re.search(r"\((\d+) warp-stall samples; tile loops: warpgroup 0 (\d+), warpgroup 1 (\d+);", text)
    total, wg0, wg1 = (int(g) for g in head.groups())
    rows = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| wg[01] \|", line)]
    for wg, n in (("wg0", wg0), ("wg1", wg1)):
        assert sum(int(r[2]) for r in rows if r[0].strip() == wg) == n
    assert wg0 + wg1 > 0.9 * total
    share = {r[1].strip(): float(r[3]) for r in rows}
    assert share["wait for P (wg0's publish)"] == max(float(r[3]) for r in rows if r[0].strip() == "wg1")
    assert share["P free, scale, mask, OR over the warpgroup"] >= 0.2
    assert int(re.search(r"OR: (\d+) guarded regions \(BSSY\) entered on every tile", text).group(1)) >= 18


def test_rn72_rule_table_counts_every_timed_shape_once():
    """perf_tables rn72-rule on the committed rn72 runs: per run, the shapes given rn72 and those
    left to the rows_m kernel (faster or slower) add up to the run's shapes, and none given rn72
    was timed slower."""
    import pandas as pd

    runs = [ROOT / "results" / "verify_attention_dev_h100" / r / "dev.csv"
            for r in ("rn72_rule_b1_p4096_87aa8e6", "rn72_rows_a3f8683")]
    table = PERF_TABLES["rn72_rule"](*map(str, runs))
    counts = {}
    for line in table.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            run = cells[0].strip("`")
            counts[run] = counts.get(run, 0) + sum(int(c.split(",")[0]) for c in cells[2:])
    assert counts == {r.parent.name: len(pd.read_csv(r).groupby(["B", "N", "H", "P"])) for r in runs}
    assert table.endswith("Given rn72 but timed slower: none")


def test_splits_ab_table_groups_by_prefix_and_names_each_slower_plan(tmp_path):
    """perf_tables splits-ab on a plan A/B CSV: a row per prefix and one for all, measured and
    modelled spreads, a row per shape with both plans, and the shapes where the new plan lost
    named with both plans; a CSV from
    before head/tail plans were compared reads as uniform plans."""
    import pandas as pd

    rows = [dict(B=8, N=65, H=8, P=4096, old_splits=3, new_splits=2, old_head=0, new_head=66, old_tail_splits=0,
                 new_tail_splits=22, old_us=94.0, new_us=80.0, new_over_old=80 / 94, model_new_over_old=0.84),
            dict(B=8, N=65, H=16, P=4096, old_splits=3, new_splits=1, old_head=132, new_head=132, old_tail_splits=22,
                 new_tail_splits=22, old_us=159.0, new_us=163.0, new_over_old=163 / 159, model_new_over_old=0.94),
            dict(B=8, N=65, H=16, P=16384, old_splits=6, new_splits=1, old_head=132, new_head=132, old_tail_splits=29,
                 new_tail_splits=29, old_us=560.0, new_us=530.0, new_over_old=530 / 560, model_new_over_old=0.96)]
    path = tmp_path / "ab.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    text = PERF_TABLES["splits_ab"](str(path))
    table = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| (\d+|all) \|", line)]
    assert [c[0].strip() for c in table] == ["4096", "16384", "all"]
    assert [int(c[1]) for c in table] == [2, 1, 3] and [int(c[4]) for c in table] == [1, 0, 1]
    assert table[2][3].strip() == "0.84 / 0.94 / 0.96"
    assert "| 8, 65, 16, 4096 | 3, 132, 22 | 1, 132, 22 | 159.0 | 163.0 | 1.025 | 0.94 |" in text.splitlines()
    assert text.splitlines()[-1] == ("Slower with the new plan: B=8 N=65 H=16 P=4096 ((splits, head, tail splits) "
                                     "(3, 132, 22) -> (1, 132, 22), 1.025)")
    old = pd.DataFrame(rows).drop(columns=["old_head", "new_head", "old_tail_splits", "new_tail_splits",
                                           "model_new_over_old"])
    old.to_csv(path, index=False)
    assert "(3, 0, 0) -> (1, 0, 0), 1.025" in PERF_TABLES["splits_ab"](str(path))


def test_tail_moves_lists_only_the_plans_today_moves_and_models_none_slower():
    """perf_tables tail-moves on the committed H100 grid: one row per pair shape whose plan
    today's ``choose_tail`` moves, never the plan the grid ran, none modelled slower, the B = 8
    shard of ``test_choose_tail_may_split_the_head_less`` among them with its head of 2 splits;
    a lower ``_TAIL_MIN_GAIN`` moves those and more, none modelled to save less than it asks, and
    the threshold is left as it was; so are other ``launch_tiles`` constants, which move other
    plans; bad values stop it with a line naming the argument."""
    from kdtree import attention

    run = str(ROOT / "results" / "verify_table_h100" / "da7c365")

    def rows(*args):
        text = PERF_TABLES["tail_moves"](run, *args)
        return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if re.match(r"\| \d+, ", line)]
    now, low = rows(), rows("0.05")
    assert now and all(r[1] != r[2] and float(r[3]) <= 1.0 for r in now)
    assert ["8, 65, 8, 4096", "3, 0, 0"] == now[[r[0] for r in now].index("8, 65, 8, 4096")][:2]
    assert any(r[0] == "8, 65, 8, 4096" and r[2].startswith("2, 66, ") for r in now)
    assert len(low) > len(now) and {r[0] for r in now} <= {r[0] for r in low}
    assert all(float(r[3]) <= 0.955 for r in low if r[1].endswith(", 0, 0"))   # a new head/tail saves 5% (2 places)
    assert attention._TAIL_MIN_GAIN == 0.1
    with pytest.raises(SystemExit, match="MIN_GAIN"):
        rows("0.5x")
    # Other constants (a refit's) move other plans, and are put back after.
    keep = (attention._BLOCK_TILES, attention._PARTIAL_TILES, attention._COMBINE_TILES, attention._COMBINE_GROWTH)
    text = PERF_TABLES["tail_moves"](run, "", "4.5,0,4")
    assert "`_TAIL_MIN_GAIN` 0.1; block, partial, combine, growth 4.5, 0, 4, 0)" in text.splitlines()[0]
    refit, grown = rows("", "4.5,0,4"), rows("", "4.5,0,4,2")
    assert refit and {r[0] for r in refit} != {r[0] for r in now} and all(r[1] != r[2] for r in refit)
    assert grown != refit
    assert (attention._BLOCK_TILES, attention._PARTIAL_TILES, attention._COMBINE_TILES,
            attention._COMBINE_GROWTH) == keep
    for bad in ("4.5,0", "4.5,-1,4", "a,b,c", "1,2,3,4,5"):
        with pytest.raises(SystemExit, match="COSTS"):
            rows("", bad)

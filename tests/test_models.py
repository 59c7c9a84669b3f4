"""The cost model (kdtree.bench.models) and the roofline classification (kdtree.bench.roofline)
on CPU: FLOPs, bytes per memory level and launches as the code's launch plan moves them."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from kdtree.attention import SM90_IMPL, launch_plan
from kdtree.bench import models, roofline
from kdtree.bench.ceilings import Ceilings
from kdtree.bench.models import ATTN_FLOPS_PER_TOKEN as F, KV_ROW_BYTES as ROW

ROOT = Path(__file__).resolve().parent.parent

# An H200-like set of ceilings (numbers of the order measured there; the tests need no GPU).
H200 = Ceilings(device="NVIDIA H200", kind="gpu", hbm_bw=4.1e12, l2_bw=7.5e12, tensor_flops=770e12,
                fp32_flops=50e12, launch_eager_us=14.0, launch_graph_us=0.9, l2_bytes=60 << 20,
                eager_floor_us={"verify_attention": 190.0, "build_tree": 108.0})


def _plan(variant, B, N, H, P, impl="wgmma"):
    return launch_plan(variant, batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=132, impl=impl)


# ---- verify attention ----

def test_useful_flops_and_minimum_bytes_follow_the_mla_model():
    c = models.verify_attention_cost("fused", batch=2, nodes=9, heads=16, prefix=100, tree_visible=3.0)
    rows = 2 * 9 * 16
    assert c.flops == rows * (100 + 3) * F
    assert c.bytes_min == rows * 576 * 2 + rows * (512 * 2 + 4) + 2 * (100 + 9) * ROW + 2 * 9 * 1 * 8


@pytest.mark.parametrize("B,N,H,P", [(1, 33, 64, 4096), (1, 257, 64, 4096), (16, 65, 64, 4096), (4, 9, 8, 100)])
def test_fused_follows_the_launch_plan(B, N, H, P):
    plan = _plan("fused", B, N, H, P, impl=None)  # the kernel the call picks (rn72 at 4, 9, 8, 100)
    c = models.verify_attention_cost("fused", batch=B, nodes=N, heads=H, prefix=P)
    assert c.launches == plan.launches and len(c.parts) == plan.launches
    tiles = math.ceil(N * H / plan.tile_rows)
    # a row tile's KV range ends after the last node among its rows: tree rows past it are masked
    ends = [P + min(N, ((r + 1) * plan.tile_rows - 1) // H + 1) for r in range(tiles)]
    assert ends[-1] == P + N and (H < 64 or ends[0] == P + 1)
    # executed FLOPs: every row tile (padding rows included) over every 64-row KV tile of its range
    assert c.flops_exec == pytest.approx(B * sum(math.ceil(e / 64) for e in ends) * plan.tile_rows * 64 * F)
    assert c.flops_exec >= c.flops
    rows = B * N * H
    partials = plan.partial_slots * rows * (512 * 2 + 4)              # bf16 o, fp32 lse
    q, kv = rows * 576 * 2, B * (P + N) * ROW
    main = c.parts[0]
    # every block loads its Q tile (once per split with tiles) and its split's KV range (once per row tile)
    per_split = [math.ceil(math.ceil(e / 64) / plan.splits) for e in ends]
    busy = sum(min(plan.splits, math.ceil(math.ceil(e / 64) / p)) for e, p in zip(ends, per_split))
    assert main.l2_read == pytest.approx(q / tiles * busy + B * sum(ends) * ROW + B * N * math.ceil(N / 64) * 8)
    # bf16 rows, partial or output, stored 4 bytes per lane and store: two sector writes per sector
    if plan.partial_slots:       # split: the partials are written, then read back by the combine
        assert main.l2_write == partials + plan.splits * rows * 512 * 2 and c.parts[1].kernel == "verify_combine"
        assert c.parts[1].dram_read == partials and c.parts[1].carried == partials
        assert c.dram_read == pytest.approx(q + kv + B * N * math.ceil(N / 64) * 8 + partials)
        assert c.hbm_bytes == pytest.approx(c.dram_bytes - partials)     # they stay in the L2 of a real call
    else:
        assert main.l2_write == rows * (2 * 512 * 2 + 4) and c.hbm_bytes == c.dram_bytes


def test_b1_n33_p4096_fused_moves_its_partials_through_dram_under_a_flush():
    # 4 splits: 8.7 MB of partials (bf16 o, fp32 lse) written and read back beside a 9.4 MB
    # minimum. (With fp32 partials, 17.3 MB, the model said 24.5 MB and the H200's counters read
    # 24.6 MB from DRAM; the bf16 partials' counters are not measured yet.)
    c = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    assert c.launches == 2 and c.dram_read == pytest.approx(15.9e6, rel=0.01)
    assert c.bytes_min == pytest.approx(9.36e6, rel=0.01) and "4 KV splits" in c.note


def test_a_block_walks_the_kv_up_to_its_last_node():
    # H = 64: a block holds one node's heads, so node n's block walks P + n + 1 KV rows, not P + N
    node = models.verify_attention_cost("fused", batch=1, nodes=513, heads=64, prefix=1024)
    full = models.verify_attention_cost("fused", batch=1, nodes=513, heads=64, prefix=1024, kv_range="full")
    tiles = sum(math.ceil((1024 + n + 1) / 64) for n in range(513))
    assert node.flops_exec / full.flops_exec == pytest.approx(tiles / (513 * math.ceil(1537 / 64)))
    assert node.flops_exec < 0.85 * full.flops_exec and node.flops == full.flops
    assert node.dram_read == pytest.approx(full.dram_read)          # the last block reads the whole range
    # the cascade's tree pass likewise; a prefix-only pass is unchanged
    c_node = models.verify_attention_cost("cascade", batch=2, nodes=65, heads=8, prefix=500)
    c_full = models.verify_attention_cost("cascade", batch=2, nodes=65, heads=8, prefix=500, kv_range="full")
    assert c_node.parts[0].flops_exec == c_full.parts[0].flops_exec
    ends = [min(65, (64 * r + 63) // 8 + 1) for r in range(9)]      # 8 nodes a row tile: 8, 16, ..., 65
    assert c_node.parts[1].l2_read - c_full.parts[1].l2_read == pytest.approx(2 * (sum(ends) - 9 * 65) * ROW)
    # a result row names its range; one that names none is modelled as the kernels walk it now,
    # a counter record as they walked it before (counters.model_launches)
    row = {"kernel": "verify_attention", "variant": "fused", "batch": 1, "q_len": 513, "heads": 64, "prefix": 1024}
    assert models.cost_for_row(row).flops_exec == node.flops_exec
    assert models.cost_for_row(row | {"kv_range": "full"}).flops_exec == full.flops_exec
    with pytest.raises(ValueError, match="kv_range"):
        models.verify_attention_cost("fused", batch=1, nodes=9, heads=8, prefix=10, kv_range="tree")


def test_cascade_writes_one_partial_set_per_split_plus_the_tree_pass():
    plan = _plan("cascade", 1, 33, 64, 4096)
    c = models.verify_attention_cost("cascade", batch=1, nodes=33, heads=64, prefix=4096)
    assert c.launches == 3 == plan.launches
    rows = 33 * 64
    part = rows * (512 * 2 + 4)                                   # bf16 o, fp32 lse
    assert c.parts[0].l2_write == plan.splits * (part + rows * 512 * 2)    # bf16 halves: two sector writes
    assert c.parts[1].l2_write == part + rows * 512 * 2
    assert c.parts[2].dram_read == plan.partial_slots * part and plan.partial_slots == plan.splits + 1
    assert f"{plan.partial_slots} partial sets" in c.note


def test_recorded_splits_and_impl_fix_the_plan():
    free = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    one = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096, splits=1)
    assert free.launches == 2 and one.launches == 1 and one.dram_read < free.dram_read
    mma = models.verify_attention_cost("fused_mma", batch=1, nodes=33, heads=64, prefix=4096)
    assert mma.parts[0].kernel == "verify_fused" and free.parts[0].kernel == f"verify_fused_{SM90_IMPL}"
    row = {"kernel": "verify_attention", "variant": "fused", "q_len": 33, "batch": 1, "heads": 64, "prefix": 4096,
           "splits": 1, "impl": "mma", "layout": "rows_m"}
    c = models.cost_for_row(row)
    assert c.launches == 1 and c.parts[0].kernel == "verify_fused"
    # the wgmma kernels move the same tiles under their own names (the counters join on them)
    pp = models.cost_for_row(row | {"impl": "tma", "splits": None})
    assert pp.parts[0].kernel == "verify_fused_tma" and pp.dram_read == free.dram_read
    assert pp.flops_exec == free.flops_exec and pp.launches == free.launches
    cols = models.launch_plan_columns("fused", batch=1, nodes=33, heads=64, kv_rows=4129)
    assert cols == {"splits": _plan("fused", 1, 33, 64, 4096).splits, "tail_splits": 0,
                    "layout": _plan("fused", 1, 33, 64, 4096).layout,
                    "impl": SM90_IMPL, "partials": "bfloat16", "kv_range": "node"}


def test_naive_rereads_the_latent_per_head_and_query_but_dram_sees_it_once():
    fused = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    naive = models.verify_attention_cost("naive", batch=1, nodes=33, heads=64, prefix=4096)
    assert naive.flops == fused.flops and naive.compute == "fp32" and naive.launches == 1
    visible = 4096 + 17
    reread = 33 * 64 * visible * ROW
    assert naive.l2_read == pytest.approx(33 * 64 * 576 * 2 + 33 * 8 + reread / models.NAIVE_RESIDENT)
    assert naive.dram_read == pytest.approx(naive.bytes_min - 33 * 64 * (512 * 2 + 4))   # every input once
    assert naive.reread > 100 and "re-reads the latent" in naive.note


def test_outputs_stay_in_the_l2_unless_the_footprint_overflows_it():
    small = models.verify_attention_cost("fused", batch=1, nodes=257, heads=64, prefix=4096)
    assert small.dram_write == 0
    big = models.verify_attention_cost("fused", batch=16, nodes=257, heads=64, prefix=4096)
    written = 16 * 257 * 64 * (512 * 2 + 4)
    assert 0 < big.dram_write <= written
    # 257 row tiles run in two waves (132 + 125 blocks); the last wave's rows are written at the
    # end and are still in the L2 when the launch ends, even an L2 of 1 MiB
    tiny_l2 = models.verify_attention_cost("fused", batch=1, nodes=257, heads=64, prefix=4096, l2_bytes=1 << 20)
    assert tiny_l2.dram_write == pytest.approx(132 * 64 * (512 * 2 + 4))
    one_wave = models.verify_attention_cost("fused", batch=64, nodes=9, heads=8, prefix=16384)
    assert one_wave.parts[0].dram_read > 60 << 20 and one_wave.dram_write == 0     # 128 blocks: one wave


def test_kv_ranges_split_across_waves_are_read_again_when_a_wave_overflows_the_l2():
    # B = 4, N = 129, H = 64: 129 row tiles per sequence, 132 resident blocks, so sequences 1, 2 and
    # 3 start in one wave and finish in the next; with two 19 MB KV ranges (two L2 copies each) a
    # wave touches more than the L2 holds and the next wave reads the range again.
    c = models.verify_attention_cost("fused", batch=4, nodes=129, heads=64, prefix=16384)
    kv_seq = (16384 + 129) * ROW
    q, vis = 4 * 129 * 64 * 576 * 2, 4 * 129 * 3 * 8
    assert c.launches == 1 and c.dram_read == pytest.approx(q + 4 * kv_seq + 3 * kv_seq + vis)
    out = 4 * 129 * 64 * (512 * 2 + 4)
    assert c.dram_write == pytest.approx(out * (516 - 120) / 516)     # the last wave (120 blocks) stays
    short = models.verify_attention_cost("fused", batch=4, nodes=129, heads=64, prefix=1024)
    assert short.dram_read == pytest.approx(q + 4 * (1024 + 129) * ROW + vis)       # a wave fits: read once


def test_co_resident_blocks_share_their_tile_reads():
    # one wave: 33 row tiles x 4 splits, each split's KV range and each Q tile read by a group
    # of co-resident blocks; merged, the L2 slices serve each once (plus the written partials)
    c = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    main = c.parts[0]
    q, kv, vis = 33 * 64 * 576 * 2, (4096 + 33) * ROW, 33 * 8
    assert main.l2_read - main.l2_shared == pytest.approx(q + kv + vis)
    assert c.l2_merged == pytest.approx(c.l2_bytes - main.l2_shared) and c.l2_merged < c.l2_bytes
    naive = models.verify_attention_cost("naive", batch=1, nodes=33, heads=64, prefix=4096)
    assert naive.l2_shared == 0 and naive.l2_merged == naive.l2_bytes


def test_unknown_variant_gets_the_minimum_and_says_so():
    c = models.verify_attention_cost("shiny", batch=1, nodes=5, heads=8, prefix=10)
    assert c.bytes_moved == c.bytes_min and "no byte model" in c.note


@pytest.mark.parametrize("kw", [dict(batch=-1), dict(nodes=0), dict(prefix=float("nan")), dict(tree_visible=99),
                                dict(batch=True)])
def test_bad_shapes_raise(kw):
    args = dict(batch=1, nodes=9, heads=8, prefix=10) | kw
    with pytest.raises(ValueError):
        models.verify_attention_cost("fused", **args)


# ---- tree kernels ----

def test_tree_kernels_read_what_the_code_reads():
    b = models.build_tree_cost("parallel", batch=8, budget=64, depth=15, topk=64)
    assert b.parts[0].kernel == "build_tree" and b.flops == 0 and "parallel" in b.note
    assert b.dram_read >= 8 * 15 * 64 * 4          # the whole log-prob block goes to shared memory
    assert b.l2_write == 8 * (65 * 12 + 4 + 65 * 2 * 8)
    assert "heap" in models.build_tree_cost("heap", batch=1, budget=64, depth=15).note
    c = models.compact_kv_cost("gpu", batch=8, depth=15, accepted=5.0, moved=3.5)
    assert c.l2_write == 8 * 3.5 * ROW and c.dram_write == 0
    assert models.compact_kv_cost("gpu", batch=1, depth=15).l2_write == 15 * ROW     # all but the root move
    both = models.accept_compact_cost("gpu", batch=8, budget=64, depth=15)
    assert both.launches == 2 and [p.kernel for p in both.parts] == ["accept_tree", "compact_kv"]


def test_cost_for_row_maps_bench_columns():
    c = models.cost_for_row({"kernel": "build", "variant": "gpu_heap", "budget": 64, "batch": 8, "depth": 15,
                             "topk": 64})
    assert c.flops == 0 and c.bytes_min > 0 and "heap" in c.note
    v = models.cost_for_row({"kernel": "verify_attention", "variant": "fused", "budget": 32, "batch": 1,
                             "heads": 8, "prefix": 10})
    assert v.flops == models.verify_attention_cost("fused", batch=1, nodes=33, heads=8, prefix=10).flops
    assert models.cost_for_row({"kernel": "other"}) is None
    with pytest.raises(ValueError, match="heads"):
        models.cost_for_row({"kernel": "verify_attention", "variant": "fused", "q_len": 9, "batch": 1, "prefix": 1})
    naive = models.cost_for_row({"kernel": "verify_attention", "variant": "naive", "q_len": 9, "batch": 1,
                                 "heads": 8, "prefix": 1, "impl": "naive", "splits": 1})
    assert naive.launches == 1
    assert set(models.COLUMNS) == set(v.columns())


# ---- roofline ----

def test_naive_is_l2_bound_far_below_the_tensor_core_roof():
    cost = models.verify_attention_cost("naive", batch=1, nodes=33, heads=64, prefix=4096)
    t_l2 = cost.l2_bytes / H200.l2_bw * 1e6
    r = roofline.classify_point(cost, H200, 2 * t_l2, "graph", "cold", "naive", "verify_attention")
    assert r["bound"] == "l2" and r["fraction"] == pytest.approx(0.5)
    assert r["ideal_roof"] == "tensor" and r["gap_to_ideal"] > 20
    assert r["diagnosis"].startswith("naive: re-reads the latent per head")
    assert "L2-bound at 50% of the L2 roof" in r["diagnosis"] and "x below the tensor-core roof" in r["diagnosis"]


def test_roofs_use_hbm_bytes_l2_bytes_and_executed_flops():
    c = models.verify_attention_cost("fused", batch=16, nodes=257, heads=64, prefix=16384)
    t = roofline.roof_times(c, H200, "graph", "cold")
    assert t["hbm"] == pytest.approx(c.hbm_bytes / H200.hbm_bw * 1e6)
    # the L2 roof: the bytes the L2 slices must serve, co-resident blocks' identical reads merged
    assert t["l2"] == pytest.approx(c.l2_merged / H200.l2_bw * 1e6) and c.l2_merged < c.l2_bytes
    assert t["tensor"] == pytest.approx(c.flops_exec / H200.tensor_flops * 1e6)
    assert t["launch"] == pytest.approx(c.launches * H200.launch_graph_us)
    # 16 x 257 blocks (one split) of 261 KV tiles on 132 SMs: 32 waves, the last 15% full
    assert t["waves"] == pytest.approx(32 * 132 * 261 * 64 * 64 * F / H200.tensor_flops * 1e6)
    r = roofline.classify_point(c, H200, t["tensor"] / 0.4, "graph", "cold", "fused", "verify_attention")
    assert r["bound"] == "waves" and r["fraction"] == pytest.approx(0.4 * t["waves"] / t["tensor"])
    assert "memory roofs from the model" in r["diagnosis"]


def test_whole_waves_roof_names_the_schedule_and_the_time_beyond_it():
    """272 blocks on 132 SMs run in three waves, the third with 8 blocks: the tensor time with
    whole waves counted is 3 / (272 / 132) of the plain tensor roof, and the diagnosis says so."""
    c = models.verify_attention_cost("fused", batch=16, nodes=17, heads=64, prefix=1024, impl="pair", splits=1)
    assert c.launches == 1 and c.flops_exec == 16 * 17 * 17 * 64 * 64 * F
    t = roofline.roof_times(c, H200, "graph", "cold")
    assert t["waves"] / t["tensor"] == pytest.approx(3 * 132 / 272)
    r = roofline.classify_point(c, H200, 2 * t["waves"], "graph", "cold", "fused", "verify_attention")
    assert r["bound"] == "waves" and r["fraction"] == pytest.approx(0.5)
    assert (f"whole-wave-bound at 50% (272 blocks of up to 17 KV tiles in 3 waves of 132 take {t['waves']:.3g} us "
            f"at the tensor-core rate, 69% of that SM time on tiles; {t['waves'] / 3:.3g} us a wave beyond it)"
            ) in r["diagnosis"]
    # a split call: the longest block holds ceil(tiles / splits) tiles; the combine's time is in the rest
    s = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096, impl="pair", splits=4)
    assert s.schedule == "132 blocks of up to 17 KV tiles in 1 wave of 132"
    d = roofline.classify_point(s, H200, 100.0, "graph", "cold", "fused", "verify_attention")["diagnosis"]
    assert "the call's other 1 launch included" in d
    naive = models.verify_attention_cost("naive", batch=1, nodes=33, heads=64, prefix=4096)
    assert naive.schedule == "" and "waves" not in roofline.roof_times(naive, H200, "graph", "cold")


def test_head_tail_schedule_ends_with_the_last_short_block():
    """The same call on its default head/tail plan: 264 whole row tiles (two waves of 17 tiles),
    then 8 row tiles in 9 splits of 2 tiles, which the 132 SMs take at the second wave's end: 36
    tile periods against the uniform plan's 51, the same FLOPs executed, partials for the tail only."""
    c = models.verify_attention_cost("fused", batch=16, nodes=17, heads=64, prefix=1024, impl="pair")
    u = models.verify_attention_cost("fused", batch=16, nodes=17, heads=64, prefix=1024, impl="pair", splits=1)
    tile = c.tile_launch
    assert (tile.blocks, tile.waves, c.launches) == (264 + 8 * 9, 3, 2) and "264 row tiles in 1 KV split" in c.note
    assert c.flops_exec == pytest.approx(u.flops_exec)
    assert tile.flops_waves / u.tile_launch.flops_waves == pytest.approx(36 / 51)
    assert c.parts[1].dram_read == pytest.approx(8 / 272 * 9 * 16 * 17 * 64 * (512 * 2 + 4))
    # a results row records the tail; its cost is the head/tail plan's, not one of its forced split count
    cols = models.launch_plan_columns("fused", batch=16, nodes=17, heads=64, kv_rows=1041, impl="pair")
    assert (cols["splits"], cols["tail_splits"]) == (1, 9)
    row = {"kernel": "verify_attention", "variant": "fused", "q_len": 17, "batch": 16, "heads": 64, "prefix": 1024}
    assert models.cost_for_row(row | cols).launches == 2
    assert models.cost_for_row(row | cols | {"tail_splits": 0}).launches == 1


def test_whole_waves_roof_is_below_every_measured_time_of_a_committed_grid():
    """A roof is a lower bound: at every fused and cascade point of the committed H200 verify grid
    (five tile kernels, 1 to 32 splits), the whole-waves tensor time at that run's dense rate is
    below the measured median, and within 10% of it at the longest one-split shapes."""
    grid = pd.read_parquet(ROOT / "results" / "verify_table_h200" / "d22219d" / "verify_table_h200.parquet")
    rate = float((grid.tflops / grid.frac_bf16).median()) * 1e12
    rows = grid[grid.variant.isin(["fused", "cascade"]) & grid.us.notna()]
    assert len(rows) > 1000 and set(rows.impl) == {"pair", "tma_seq", "tma", "wgmma", "mma"}
    ratio = {}
    for r in rows.itertuples():
        c = models.verify_attention_cost(r.variant, batch=r.B, nodes=r.N, heads=r.H, prefix=r.P, impl=r.impl,
                                         splits=int(r.splits), layout=r.layout)
        ratio[(r.config, r.B, r.N, r.H, r.P)] = c.flops_waves / rate * 1e6 / r.us
    assert max(ratio.values()) < 1.0
    assert ratio[("fused", 16, 65, 64, 32768)] > 0.9 and ratio[("fused", 4, 129, 64, 32768)] > 0.9


def test_counter_bytes_replace_the_models_memory_roofs():
    # B = 1, N = 33, H = 64, P = 4096 on an H200: the SMs read 184 MB from the L2 (as modelled), the
    # slices served 74.5 MB: on those bytes the tensor cores bind (whole waves counted), not the L2
    c = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    counted = {"dram": 24.8e6, "l2": 74.5e6 + 19.6e6}
    t = roofline.roof_times(c, H200, "graph", "cold", counted)
    assert t["l2"] == pytest.approx(94.1e6 / H200.l2_bw * 1e6)
    assert t["hbm"] == pytest.approx((24.8e6 - (c.dram_bytes - c.hbm_bytes)) / H200.hbm_bw * 1e6)
    r = roofline.classify_point(c, H200, 60.0, "graph", "cold", "fused", "verify_attention", counted)
    assert r["bound"] == "waves" and "memory roofs from the counters: 24.8 MB DRAM, 94.1 MB" in r["diagnosis"]


def test_eager_points_get_the_host_floor_not_a_device_roof():
    small = models.verify_attention_cost("fused", batch=1, nodes=2, heads=8, prefix=1)
    r = roofline.classify_point(small, H200, 380.0, "eager", "warm", "fused", "verify_attention")
    assert r["bound"] == "host" and r["fraction"] == pytest.approx(0.5) and math.isnan(r["ideal_us"])
    assert "host floor of 190 us" in r["diagnosis"] and "2.0x the floor" in r["diagnosis"]
    casc = models.verify_attention_cost("cascade", batch=1, nodes=33, heads=64, prefix=4096)
    assert H200.eager_floor("verify_attention", casc.launches) == pytest.approx(190.0 + 2 * 14.0)
    assert H200.eager_floor("compact_kv", 1) == 14.0                # not measured: one bare eager launch
    tiny = models.verify_attention_cost("fused", batch=1, nodes=2, heads=8, prefix=200, splits=4)  # a tile a block
    g = roofline.classify_point(tiny, H200, 1.2 * tiny.launches, "graph", "warm", "fused", "verify_attention")
    assert g["bound"] == "launch" and "launch-bound" in g["diagnosis"]


def test_eager_points_use_the_floor_timed_beside_them_plus_their_extra_launches():
    # the interleaved floor of the trivial call (1 launch) replaces the run's per-op floor (190 us);
    # a split call (2 launches: partials and combine) adds one eager launch to it
    split = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    assert split.launches == 2
    r = roofline.classify_point(split, H200, 160.0, "eager", "cold", "fused", "verify_attention",
                                floor_us=106.0, floor_launches=1)
    assert r["attainable_us"] == pytest.approx(106.0 + 14.0) and r["fraction"] == pytest.approx(120.0 / 160.0)
    same = roofline.classify_point(split, H200, 160.0, "eager", "cold", "fused", "verify_attention",
                                   floor_us=106.0, floor_launches=3)            # never below the floor itself
    assert same["attainable_us"] == pytest.approx(106.0)
    df = pd.DataFrame([{"kernel": "verify_attention", "variant": "fused", "q_len": 33, "prefix": 4096, "batch": 1,
                        "heads": 64, "mode": "eager", "l2": "cold", "median_us": 160.0, "floor_us": 106.0,
                        "floor_launches": 1.0},
                       {"kernel": "verify_attention", "variant": "fused", "q_len": 33, "prefix": 4096, "batch": 1,
                        "heads": 64, "mode": "eager", "l2": "cold", "median_us": 160.0, "floor_us": float("nan"),
                        "floor_launches": float("nan")}])
    out = roofline.classify(df, H200)
    assert list(out["attainable_us"]) == pytest.approx([120.0, H200.eager_floor("verify_attention", 2)])


def test_warm_l2_removes_the_hbm_roof_only_when_the_data_fits():
    fits = models.verify_attention_cost("fused", batch=1, nodes=9, heads=8, prefix=1024)
    assert roofline.roof_times(fits, H200, "graph", "warm")["hbm"] == 0
    assert roofline.roof_times(fits, H200, "graph", "cold")["hbm"] > 0
    huge = models.verify_attention_cost("fused", batch=64, nodes=9, heads=8, prefix=65536)
    assert roofline.roof_times(huge, H200, "graph", "warm")["hbm"] > 0


def test_serial_kernel_far_above_its_roofs_is_latency_bound():
    cost = models.build_tree_cost("gpu", batch=1, budget=64, depth=15)
    r = roofline.classify_point(cost, H200, 200.0, "graph", "warm", "gpu", "build")
    assert r["bound"] == "latency" and "latency-bound" in r["diagnosis"]
    assert r["ideal_roof"] == "launch" and r["diagnosis"].endswith("222x the one-launch floor")


def test_host_rows_against_gpu_ceilings_get_no_roof():
    cost = models.build_tree_cost("cpu_paper", batch=1, budget=64, depth=15)
    r = roofline.classify_point(cost, H200, 900.0, "host", "n/a", "cpu_paper", "build")
    assert r["bound"] == "host" and math.isnan(r["fraction"])


def test_classify_adds_columns_and_leaves_unmodelled_rows_empty():
    df = pd.DataFrame([{"kernel": "verify_attention", "variant": "naive", "q_len": 33, "prefix": 4096, "batch": 1,
                        "heads": 64, "mode": "graph", "l2": "cold", "median_us": 1500.0},
                       {"kernel": "build", "variant": "gpu", "budget": 64, "batch": 1, "mode": "eager", "l2": "warm",
                        "median_us": 216.0},
                       {"kernel": "mystery", "variant": "x", "mode": "graph", "l2": "cold", "median_us": 5.0}])
    out = roofline.classify(df, H200)
    assert set(roofline.COLUMNS) <= set(out.columns) and len(out) == 3
    assert out.loc[0, "bound"] == "l2" and out.loc[0, "fraction"] < 1
    assert out.loc[1, "bound"] == "host" and out.loc[1, "fraction"] == pytest.approx(0.5)
    assert pd.isna(out.loc[2, "bound"])
    with pytest.raises(ValueError, match="median_us"):
        roofline.classify(df.drop(columns=["median_us"]), H200)


def test_a_point_whose_sm_clock_dropped_gets_its_fraction_at_that_clock_too():
    hot = dataclasses.replace(H200, tensor_clock_mhz=1980.0)
    cost = models.verify_attention_cost("fused", batch=16, nodes=129, heads=64, prefix=32768)
    times = roofline.roof_times(cost, hot, "graph", "cold")
    bound = max(times, key=times.get)
    assert bound in ("tensor", "waves")
    median = times[bound] / 0.8
    kw = dict(mode="graph", l2="cold", variant="fused", kernel="verify_attention")
    slow = roofline.classify_point(cost, hot, median, sm_clock_mhz=1683.0, **kw)
    assert slow["fraction"] == pytest.approx(0.8) and slow["clock_ratio"] == pytest.approx(0.85)
    assert slow["diagnosis"].endswith(f"the SM clock ran at 1683 MHz, 85% of the 1980 MHz the bf16 rate was measured "
                                      f"at (power or thermal limit): 94% of the {roofline.ROOF_LABELS[bound]} roof at "
                                      f"its own clock")
    at_speed = roofline.classify_point(cost, hot, median, sm_clock_mhz=1965.0, **kw)     # one 15 MHz step
    unknown = roofline.classify_point(cost, H200, median, sm_clock_mhz=1683.0, **kw)     # probe clock not recorded
    assert at_speed["clock_ratio"] > roofline.CLOCK_NOTE_BELOW and math.isnan(unknown["clock_ratio"])
    assert "MHz" not in at_speed["diagnosis"] + unknown["diagnosis"]
    assert at_speed["fraction"] == unknown["fraction"] == slow["fraction"]
    # a memory-bound point: the SM clock does not set its roof, so no clause
    naive = models.verify_attention_cost("naive", batch=1, nodes=33, heads=64, prefix=4096)
    r = roofline.classify_point(naive, hot, 1500.0, sm_clock_mhz=1683.0, **kw)
    assert r["bound"] == "l2" and r["clock_ratio"] == pytest.approx(0.85) and "MHz" not in r["diagnosis"]
    # classify reads each row's sampled clock
    row = {"kernel": "verify_attention", "variant": "fused", "q_len": 129, "prefix": 32768, "batch": 16,
           "heads": 64, "mode": "graph", "l2": "cold", "median_us": median}
    out = roofline.classify(pd.DataFrame([{**row, "sm_clock_mhz": 1683.0}, row]), hot)
    assert out.loc[0, "clock_ratio"] == pytest.approx(0.85) and math.isnan(out.loc[1, "clock_ratio"])
    assert out.loc[0, "diagnosis"] == slow["diagnosis"]


def test_ceilings_files_from_before_the_probe_clock_load_without_it(tmp_path):
    path = dataclasses.replace(H200, tensor_clock_mhz=1980.0).save(tmp_path / "c.json")
    assert Ceilings.load(path).tensor_clock_mhz == 1980.0
    data = json.loads(path.read_text())
    del data["tensor_clock_mhz"]
    path.write_text(json.dumps(data))
    assert math.isnan(Ceilings.load(path).tensor_clock_mhz)


def test_bad_timing_mode_and_l2_state_raise():
    cost = models.verify_attention_cost("fused", batch=1, nodes=9, heads=8, prefix=10)
    with pytest.raises(ValueError, match="mode"):
        roofline.roof_times(cost, H200, "turbo", "cold")
    with pytest.raises(ValueError, match="l2"):
        roofline.roof_times(cost, H200, "graph", "lukewarm")


def test_ideal_roof_is_the_fastest_compute_unit():
    cpu = Ceilings(device="CPU (test)", kind="cpu", hbm_bw=1e10, l2_bw=5e10, tensor_flops=1e9, fp32_flops=8e10,
                   launch_eager_us=7.0, launch_graph_us=float("nan"))
    cost = models.verify_attention_cost("torch", batch=1, nodes=33, heads=8, prefix=4096)
    t, roof = roofline.ideal_time(cost, cpu, "host")
    assert roof == "fp32" and t == pytest.approx(cost.flops / 8e10 * 1e6)
    assert roofline.ideal_time(cost, H200, "graph")[1] == "tensor"
    lines = roofline.roof_lines(cpu)
    assert lines[lines.roof == "hbm"]["flops"].max() == pytest.approx(8e10)


# ---- the benchmark path ----

def test_variants_are_found_by_name_at_run_time(monkeypatch):
    from kdtree import attention
    from kdtree.bench import attention_sweep
    from kdtree.bench.attention_sweep import runnable_variants

    assert runnable_variants(torch.device("cpu")) == ["torch"]
    monkeypatch.setattr(attention, "VARIANTS", (*attention.VARIANTS, "shiny"))
    monkeypatch.setattr(attention_sweep, "VARIANTS", (*attention_sweep.VARIANTS, "bench_only"))
    on_gpu = runnable_variants(torch.device("cuda"))
    assert {"shiny", "bench_only", "fused_mma", *attention.CUDA_VARIANTS} <= set(on_gpu)
    assert "shiny" in runnable_variants(torch.device("cpu"))      # not declared CUDA-only
    with pytest.raises(ValueError, match="bogus"):
        runnable_variants(torch.device("cpu"), ["bogus"])


def test_the_time_budget_comes_from_the_model():
    from kdtree.bench.attention_sweep import predicted_seconds

    naive = models.verify_attention_cost("naive", batch=16, nodes=257, heads=64, prefix=16384)
    floor = max(roofline.roof_times(naive, H200, "graph", "cold").values())
    assert predicted_seconds(floor, 24, quick=True) > 20        # skipped under the default budget
    fused = models.verify_attention_cost("fused", batch=1, nodes=33, heads=64, prefix=4096)
    floor = max(roofline.roof_times(fused, H200, "graph", "cold").values())
    assert predicted_seconds(floor, 24, quick=True) < 1
    assert predicted_seconds(2 * floor, 24, quick=False) > predicted_seconds(floor, 24, quick=False)


def test_the_cpu_sweep_records_the_plan_and_the_clocks():
    from kdtree.bench.attention_sweep import run_attention_sweep

    df = run_attention_sweep([5], [16], [1], [8], quick=True, progress=False)
    assert set(df["variant"]) == {"torch"}
    assert {"splits", "layout", "impl", "sm_clock_mhz", "mem_clock_mhz"} <= set(df.columns)
    with pytest.raises(ValueError, match="budget_s"):
        run_attention_sweep([5], [16], [1], [8], budget_s=0)


def test_a_sweep_over_several_points_times_each_on_its_own_inputs():
    """The host (on a GPU: eager) timings of every point are taken after the loop over the points
    (``timing.Rounds``): each must still call its own point's tree and prefix lengths. Calls
    bound to the last point's tree raised a shape error at every other point on an H200."""
    from kdtree.bench.attention_sweep import run_attention_sweep

    df = run_attention_sweep([5, 9], [16, 40], [1, 2], [8], quick=True, progress=False)
    assert len(df) == 8 and df["median_us"].gt(0).all()
    assert set(map(tuple, df[["q_len", "prefix", "batch"]].to_numpy())) == {
        (n, p, b) for n in (5, 9) for p in (16, 40) for b in (1, 2)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_sweep_replays_a_points_variants_in_one_turn(monkeypatch):
    """On a GPU the graph timings of all the variants at a point are taken in one alternating
    turn (``timing.time_graphs``: a warm and a cold graph per variant), so that the variants are
    compared at the same SM clock; each variant still gets its four rows."""
    from kdtree.bench import attention_sweep as S

    turns = []
    real = S.time_graphs
    monkeypatch.setattr(S, "time_graphs", lambda fns, **k: turns.append(len(fns)) or real(fns, **k))
    df = S.run_attention_sweep([5], [16], [1, 2], [8], variants=["fused", "cascade"], quick=True, progress=False)
    assert turns == [4, 4]
    assert len(df) == 16 and df["median_us"].gt(0).all()
    g = df[df["mode"] == "graph"]
    assert sorted(map(tuple, g[["variant", "l2"]].drop_duplicates().to_numpy())) == [
        ("cascade", "cold"), ("cascade", "warm"), ("fused", "cold"), ("fused", "warm")]


def test_verify_model_takes_the_partials_dtype():
    """bf16 partials (the kernels' own) halve each split's O bytes against fp32's; the lse stays
    fp32; an unknown dtype is refused by name."""
    kw = dict(batch=1, nodes=33, heads=64, prefix=4096)
    bf16 = models.verify_attention_cost("fused", **kw)
    fp32 = models.verify_attention_cost("fused", partials="float32", **kw)
    rows, slots = 33 * 64, bf16.parts[1].dram_read / (33 * 64 * (512 * 2 + 4))
    assert slots == _plan("fused", 1, 33, 64, 4096).splits
    assert fp32.parts[1].dram_read == slots * rows * (512 * 4 + 4)
    with pytest.raises(ValueError, match="partials"):
        models.verify_attention_cost("fused", partials="int8", **kw)

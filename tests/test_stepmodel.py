"""The step model: its sums, its communication model, its speedup arithmetic, and its
measurements on CPU at tiny sizes."""
import contextlib
import math
import time

import pandas as pd
import pytest
import torch

from kdtree.bench import stepmodel as S
from kdtree.bench import timing


@pytest.fixture(scope="module")
def moe_components():
    return S.measure_components("tiny_ep", [1, 2], [16, 32], [32, 64], drafter="tiny")


@pytest.fixture(scope="module")
def dense_components():
    return S.measure_components("dense_tiny", [1], [16], [32], drafter="tiny")


def test_host_components_outlast_a_burst_over_part_of_the_measurement(monkeypatch):
    """On a CPU every component row (decode phases included) is timed in rounds spread over the
    whole measurement: a host clock that counts every call double for the first 40% of the
    measurement's wall time (a burst of interference) leaves every row its undisturbed time.
    Timed row by row, the rows measured inside the burst would read double."""
    step, burst, seen = 1e-5, [math.inf], []   # the clock's tick per read, the burst's length (s), read times

    @contextlib.contextmanager
    def ticking():
        reads = [0.0]

        def clock():
            seen.append(time.perf_counter())
            reads[0] += 2 * step if seen[-1] - seen[0] < burst[0] else step
            return reads[0]
        yield clock

    monkeypatch.setattr(timing, "host_clock", ticking)
    monkeypatch.setattr(S, "HOST_ROUNDS_S", 0.01)
    burst[0] = 0.0
    quiet = S.measure_components("dense_tiny", [1], [16], [32], drafter="tiny")
    burst[0] = 0.4 * (seen[-1] - seen[0])
    seen.clear()
    loud = S.measure_components("dense_tiny", [1], [16], [32], drafter="tiny")
    assert seen[-1] - seen[0] > burst[0] > 0                               # the burst ended inside it
    per = loud.component.map(lambda c: 2 if c == "compact" else 1)         # compaction: per layer of 2
    for c in (quiet, loud):
        assert len(c) > 20 and ((c.median_us * per).round(6) == step * 1e6).all(), c[["component", "median_us"]]


def test_components_cover_every_step(moe_components):
    c = moe_components
    assert ((c.p20_us <= c.median_us) & (c.median_us <= c.p80_us) & (c.median_us > 0)).all()
    for B in (1, 2):
        for N in (1, 16, 17, 33):
            here = c[(c.batch == B) & (c.nodes == N)]
            assert {"moe", "dense_ffn", "norms", "embed_head", "attention"} <= set(here.component)
            assert sorted(here[here.component == "attention"].prefix) == [32, 64]
        ddtree = c[(c.batch == B) & (c.budget_label == "16")]
        assert set(ddtree.component) == {"draft", "topk", "build", "accept", "compact", "commit"}
        assert set(c[(c.batch == B) & (c.budget_label == "0")].component) == {"commit"}


def test_prediction_is_the_sum_of_its_components(moe_components):
    for budget in (0, "chain", 16, 32):
        p = S.predict(moe_components, layers=5, first_dense=1, batch=2, budget=budget, prefix=64, gpus=4, dim=64, k=4)
        assert p["step"] == pytest.approx(sum(v for k, v in p.items() if k != "step"), rel=1e-12)
        assert ("draft" in p) == (budget != 0) and p["comm"] > 0


def test_prediction_grows_by_one_layer_per_layer(moe_components):
    """One more MoE layer adds its attention, norms, MoE, compaction and communication: the table's values."""
    kw = dict(first_dense=1, batch=1, budget=16, prefix=32, gpus=4, dim=64, k=4)
    c = moe_components[(moe_components.batch == 1) & (moe_components.nodes == 17)]

    def one(name, **where):
        r = c[c.component == name]
        for col, v in where.items():
            r = r[r[col] == v]
        return float(r.median_us.iloc[0])

    layer = (one("attention", prefix=32) + one("norms") + one("moe") + one("compact", budget_label="16")
             + S.comm_per_layer_us(17, 64, 4, S.Link(), "allreduce", moe=True, k=4))
    diff = S.predict(moe_components, layers=7, **kw)["step"] - S.predict(moe_components, layers=6, **kw)["step"]
    assert diff == pytest.approx(layer, rel=1e-9)


def test_link_model_hand_numbers():
    link = S.Link(bandwidth=100e9, latency_us=5.0)
    assert link.allreduce_us(1e6, 1) == 0.0
    assert link.allreduce_us(1e6, 8) == pytest.approx(5.0 + 2 * 7 / 8 * 1e6 / 100e9 * 1e6)   # 22.5 us
    assert link.alltoall_us(2e6, 4) == pytest.approx(25.0)
    act = 10 * 64 * 2
    assert S.comm_per_layer_us(10, 64, 8, link) == pytest.approx(2 * link.allreduce_us(act, 8))
    slots = 10 / 8 * 4 * 7 / 8 * 64 * 2
    assert S.comm_per_layer_us(10, 64, 8, link, "alltoall", k=4) == pytest.approx(
        link.allreduce_us(act, 8) + 5.0 + 2 * link.alltoall_us(slots, 8))
    assert S.comm_per_layer_us(10, 64, 8, link, "alltoall", moe=False) == S.comm_per_layer_us(10, 64, 8, link)
    with pytest.raises(ValueError, match="comm"):
        S.comm_per_layer_us(10, 64, 8, link, "broadcast")


def test_speedup_table_arithmetic(moe_components):
    tau = {16: 5.0, 32: 6.0}
    t = S.speedup_table(moe_components, layers=3, first_dense=1, batches=[1, 2], prefixes=[32, 64], tau=tau,
                        tau_chain=4.0, gpus=4, dim=64, k=4, label="tiny_ep")
    assert len(t) == 2 * 2 * 4
    greedy = t[t.decode == "greedy"]
    assert (greedy.speedup == 1.0).all() and (greedy.step_us == greedy.greedy_us).all()
    assert (t.speedup == t.tau * t.greedy_us / t.step_us).all()
    for _, part in t.groupby(["batch", "prefix"]):
        best = part[part.best]
        assert len(best) == 1 and best.decode.iloc[0] == "ddtree"
        assert best.speedup.iloc[0] == part[part.decode == "ddtree"].speedup.max()
    assert list(t[t.decode == "chain"].tau.unique()) == [4.0]
    b = S.best_budgets(t)
    assert len(b) == 4 and set(b.budget) <= {16, 32}
    default = S.speedup_table(moe_components, layers=3, first_dense=1, batches=[1], prefixes=[32],
                              tau={16: S.PAPER_TAU[16]}, label="x")
    assert default[default.decode == "chain"].tau.iloc[0] == S.PAPER_TAU_CHAIN


def test_best_budget_statement_reads_the_table(moe_components):
    t = S.speedup_table(moe_components, layers=3, first_dense=1, batches=[1, 2], prefixes=[32, 64],
                        tau={16: 5.0, 32: 9.0}, tau_chain=4.0, gpus=4, dim=64, k=4, label="tiny_ep")
    lines = S.best_budget_statement(t)
    assert len(lines) == 2 and lines[0].startswith("Prefix 32: tiny_ep on 4 GPUs: best budget ")
    for line, (_, part) in zip(lines, t.groupby("prefix", sort=True)):
        for B in (1, 2):
            r = part[(part.batch == B) & part.best].iloc[0]
            assert f"{int(r.budget)} at batch {B} ({r.speedup:.2f}x greedy" in line
    assert S.best_budget_statement(t, batches=[2])[0].count("at batch") == 1
    with pytest.raises(ValueError, match="batches"):
        S.best_budget_statement(t, batches=[16])


def test_paper_tau_constant():
    assert list(S.PAPER_TAU) == [16, 32, 64, 128, 256, 512, 1024]
    assert list(S.PAPER_TAU.values()) == [8.6, 9.25, 9.75, 10.2, 10.4, 10.7, 11.0] and S.PAPER_TAU_CHAIN == 7.8


def test_engine_tau_reads_the_throughput_table():
    t = pd.DataFrame({"decode": ["ar", "chain", "ddtree", "ddtree", "ddtree"], "budget": [0, 15, 16, 64, 16],
                      "tau": [1.0, 7.5, 8.0, 9.0, 3.0], "mode": ["graph"] * 4 + ["eager"],
                      "accuracy": ["paper"] * 5})
    tau, chain = S.engine_tau(t)
    assert tau == {16: 8.0, 64: 9.0} and chain == 7.5
    with pytest.raises(ValueError, match="throughput"):
        S.engine_tau(t[t.decode == "ar"])


def test_dense_attention_matches_a_float64_reference(gen):
    cfg = S.DENSE_TINY
    attn = S._init(lambda: S.DenseAttention(cfg), "cpu", torch.float32, 0)
    B, N, P = 2, 5, 7
    x = torch.randn(B, N, cfg.dim, generator=gen)
    kc = torch.randn(B, cfg.n_kv_heads, P + N, cfg.head_dim, generator=gen)
    vc = torch.randn_like(kc)
    out = attn(x, kc, vc, P)
    q, k, v = attn.wqkv(x).double().split([cfg.n_heads * 16, cfg.n_kv_heads * 16, cfg.n_kv_heads * 16], -1)
    K = torch.cat((kc[:, :, :P].double(), k.view(B, N, 2, 16).transpose(1, 2)), 2)
    V = torch.cat((vc[:, :, :P].double(), v.view(B, N, 2, 16).transpose(1, 2)), 2)
    g = cfg.n_heads // cfg.n_kv_heads
    q = q.view(B, N, cfg.n_heads, 16).transpose(1, 2)                              # [B, H, N, hd]
    K, V = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)                    # head h uses kv h // g
    o = torch.softmax(q @ K.transpose(-1, -2) / math.sqrt(16), -1) @ V
    ref = attn.wo.weight.double() @ o.transpose(1, 2).reshape(B, N, -1)[..., None]
    torch.testing.assert_close(out.double(), ref[..., 0], atol=1e-5, rtol=1e-5)
    assert torch.equal(kc[:, :, P:], k.view(B, N, 2, 16).transpose(1, 2).float())  # the tree rows written


def test_dense_model_components(dense_components):
    p = S.predict(dense_components, layers=4, first_dense=0, batch=1, budget=16, prefix=32)
    assert "ffn" in p and "moe" not in p and "comm" not in p
    assert p["step"] == pytest.approx(sum(v for k, v in p.items() if k != "step"), rel=1e-12)


def test_validate_on_cpu():
    v = S.validate("tiny_ep", layers=2, batch=1, budgets=(16,), prompt=12, new=8, steps=2, drafter="tiny")
    assert list(v.budget) == [0, 16] and (v.measured_us > 0).all()
    assert (v.ratio == v.predicted_us / v.measured_us).all() and (v.timing == "eager").all()
    assert (v.ratio_random == v.predicted_random_us / v.measured_us).all()
    parts = v[[c for c in v.columns if c.startswith("c_")]].sum(axis=1)
    assert ((parts - v.predicted_us).abs() <= 1e-9 * v.predicted_us).all()   # the prediction is its sum
    assert ((v.distinct_engine >= 1) & (v.distinct_engine <= 4) & (v.distinct_random <= 4)).all()  # 4 local
    assert {"c_draft", "c_compact", "c_moe", "c_attention"} <= set(v.columns) and (v.status == "ok").all()
    assert ((v.measured_p20_us <= v.measured_us) & (v.measured_us <= v.measured_p80_us)).all()
    assert (v.predicted_cold_us == v.predicted_us).all()            # one host timing on a CPU
    assert (v.measured_verify_us < v.measured_us).all()             # eager: the step is its phases' sum
    forward = v[["c_attention", "c_norms", "c_moe", "c_dense_ffn", "c_embed_head"]].sum(axis=1)
    assert ((v.predicted_verify_us - forward).abs() <= 1e-9 * forward).all()
    assert (v.predicted_verify_us < v.predicted_us).all()


def test_validate_presets_time_the_engines_own_phases(monkeypatch):
    """Two presets: each validated with the decode phases of its own engine step (no probe
    model), ``within`` the 15% rule on each row's ratio; a preset that does not fit the given
    memory is listed, not run."""
    monkeypatch.setattr(S, "_phase_timings", lambda *a, **k: pytest.fail("probe phases measured"))
    v = S.validate_presets(["tiny_ep", "tiny"], layers=2, budgets=(16,), prompt=12, new=8, steps=2, drafter="tiny")
    assert list(v.preset) == ["tiny_ep", "tiny_ep", "tiny", "tiny"] and (v.status == "ok").all()
    assert (v.within == ((v.ratio - 1).abs() <= 0.15)).all()
    assert (v.c_draft[v.budget == 16] > 0).all() and v.c_draft[v.budget == 0].isna().all()
    assert set(S.fitting_presets()) == {"kimi_k2_attn", "kimi_k2_tp8", "kimi_k2_tp4", "kimi_k2_tp2", "kimi_k2_ep8",
                                        "kimi_k2_ep8_fp8"}
    assert S.fitting_presets(memory_bytes=8 * 2**30) == []                        # none fits 8 GiB
    big = S.validate_presets(["kimi_k2_ep8"], layers=2, budgets=(16, 64), memory_bytes=4 * 2**30)
    assert list(big.budget) == [0, 16, 64] and big.measured_us.isna().all() and not big.within.any()
    assert big.status.str.startswith("does not fit one GPU").all()
    with pytest.raises(ValueError, match="presets"):
        S.validate_presets([], layers=2)


def test_validate_keeps_the_second_steps_moe_inputs():
    """The hooks keep forward 2 of each MoE layer (prefill, step 1, step 2) and nothing else."""
    from kdtree.engine.config import get_config
    from kdtree.engine.model import build_model

    model = build_model(get_config("tiny_ep"), seed=0)
    moes = [b.ffn for b in model.layers if isinstance(b.ffn, S.MoE)]
    hooks = S._MoEInputs(moes)
    xs = [torch.full((1, 3, 64), float(i)) for i in range(4)]
    for x in xs:
        moes[0](x)
    assert torch.equal(hooks.remove()[0], xs[2])
    moes[0](xs[0])                                                                 # removed: nothing kept
    assert hooks.count == [4]
    short = S._MoEInputs(moes)
    moes[0](xs[0])
    with pytest.raises(RuntimeError, match="forward 2"):
        short.remove()


def test_bad_input_names_the_argument(moe_components):
    with pytest.raises(ValueError, match="layers"):
        S.predict(moe_components, layers=0, first_dense=0, batch=1, budget=16, prefix=32)
    with pytest.raises(ValueError, match="components"):
        S.predict(moe_components, layers=2, first_dense=1, batch=3, budget=16, prefix=32)
    with pytest.raises(ValueError, match="dim"):
        S.predict(moe_components, layers=2, first_dense=1, batch=1, budget=16, prefix=32, gpus=2)
    with pytest.raises(ValueError, match="n_kv_heads"):
        S.DenseConfig(2, 64, 4, 3, 16, 128, 256)
    with pytest.raises(ValueError, match="name"):
        S.measure_components("kimi", [1], [16], [32])
    with pytest.raises(ValueError, match="l2"):
        S.measure_components("tiny_ep", [1], [16], [32], l2="hot")

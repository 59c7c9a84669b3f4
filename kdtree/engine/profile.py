"""Where a decode step's time goes, and what DDTree buys: step breakdowns and throughput sweeps.

``step_breakdown`` prefills a batch, runs warm-up steps, then times ``steps`` more and returns
tidy rows (one per phase and timing mode: median and p20/p80 in microseconds). The phases are
those of ``ddtree_phases`` (draft, topk, build, verify, accept, compact, commit) or of
``ar_phases`` (verify, commit), plus:

* ``verify.attention``: ``attend`` alone at the step's shapes (batch, N = budget + 1 nodes,
  heads, cache length, the live prefix lengths), once per layer; ``verify.rest`` is verify
  minus that. The tree is a chain of N nodes: the kernels' cost does not depend on which
  nodes see which (every tile of the tree rows is computed and masked).
* ``step``: a whole step; ``host``: host time to issue one step (eager: the Python and launch
  cost of all phases; graph: one ``graph.replay()`` call).

Timing rules (DESIGN.md): device time from CUDA events, warm-up first, median and spread of
many repetitions. ``timing="graph"`` captures each phase in its own graph and replays them in
order (each replay costs one graph launch, so the phases sum to a bit more than ``step``, which
is the whole step in one graph). On CPU the work is synchronous and the host clock is the
device clock. The CUDA paths are written for a GPU session and unmeasured.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from kdtree.engine.ddtree import capture, chain_tree, generate, make_phases, run_phases, start
from kdtree.engine.drafter import SyntheticDrafter
from kdtree.engine.model import attend


class _Clock:
    """CUDA events on a GPU, the host clock on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) * 1e-3 if self.cuda else b - a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def _time(fns, clock: _Clock, reps: int) -> dict[str, list[float]]:
    """Seconds per named call over ``reps`` rounds of calling ``fns`` in order, plus the host time."""
    out = {name: [] for name, _ in fns} | {"host": []}
    for _ in range(reps):
        marks, t0 = [clock.mark()], time.perf_counter()
        for _, fn in fns:
            fn()
            marks.append(clock.mark())
        out["host"].append(time.perf_counter() - t0)
        clock.sync()
        for i, (name, _) in enumerate(fns):
            out[name].append(clock.seconds(marks[i], marks[i + 1]))
    return out


def _graphs(phases) -> list:
    """Each phase captured in its own CUDA graph (capturing runs nothing; the data flow between
    phases goes through the tensors the earlier captures allocated)."""
    out = []
    for name, fn in phases:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        out.append((name, graph.replay))
    return out


@torch.no_grad()
def step_breakdown(model, prompts, mode: str = "ddtree", drafter=None, budget: int = 64,
                   topk: int | None = None, steps: int = 20, warmup: int = 3, timing: str = "eager",
                   max_new_tokens: int = 128) -> list[dict]:
    """Time each phase of a decode step.

    Parameters
    ----------
    model, prompts, mode, drafter, budget, topk
        As for ``generate``.
    steps, warmup : int
        Timed and untimed steps (sequences that reach ``max_new_tokens`` keep stepping with
        the same static work, so any number of steps is fine).
    timing : {"eager", "graph"}
        Eager launches, or CUDA-graph replay (CUDA only).

    Returns
    -------
    list of dict
        One row per phase: mode, timing, phase, budget, batch, steps, median_us, p20_us, p80_us.
    """
    if timing not in ("eager", "graph"):
        raise ValueError(f"timing: expected 'eager' or 'graph', got {timing!r}")
    for name, value in (("steps", steps), ("warmup", warmup)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    state, phases = start(model, prompts, max_new_tokens, mode, drafter, budget, topk)
    clock = _Clock(state.root.device)
    if timing == "graph" and not clock.cuda:
        raise ValueError(f"timing: 'graph' needs a CUDA model, the model is on {state.root.device}")
    for _ in range(warmup):
        run_phases(phases)
    if timing == "eager":
        times = _time(phases, clock, steps)
        times["step"] = [sum(parts) for parts in zip(*(times[name] for name, _ in phases))]
    else:
        whole = capture(lambda: run_phases(make_phases(model, state, mode, drafter, budget, topk)), warmup=1)
        times = _time([("step", whole.replay)], clock, steps)
        times |= {k: v for k, v in _time(_graphs(phases), clock, steps).items() if k != "host"}
    # The attention share of verify, at this step's shapes.
    cfg, kv = model.cfg, state.cache.kv[0]
    N = 1 if mode == "ar" else budget + 1
    tree = chain_tree(torch.full((state.cache.batch,), N, device=kv.device), N)
    q = torch.randn(state.cache.batch, N, cfg.n_heads, cfg.latent_dim, device=kv.device).to(kv.dtype)
    call = [("attention", lambda: attend(q, kv, state.cache.lengths, tree, cfg.softmax_scale, cfg.kv_lora_rank))]
    for _ in range(warmup):
        call[0][1]()
    att = _time(call if timing == "eager" else _graphs(call), clock, steps)["attention"]
    times["verify.attention"] = [t * cfg.n_layers for t in att]
    times["verify.rest"] = [v - a for v, a in zip(times["verify"], times["verify.attention"])]
    rows = []
    for phase, secs in times.items():
        us = np.asarray(secs) * 1e6
        rows.append(dict(mode=mode, timing=timing, phase=phase, budget=budget if mode == "ddtree" else 0,
                         batch=state.cache.batch, steps=steps, median_us=float(np.median(us)),
                         p20_us=float(np.percentile(us, 20)), p80_us=float(np.percentile(us, 80))))
    return rows


def set_greedy_reference(model, prompts, max_new_tokens: int, drafter: SyntheticDrafter,
                         cuda_graph: bool = False) -> torch.Tensor:
    """Decode greedily ``max_new_tokens + draft_len`` tokens (so the last drafts are covered too),
    make that the synthetic drafter's reference, and return the first ``max_new_tokens`` [B, T]."""
    ref = generate(model, prompts, max_new_tokens + drafter.draft_len, mode="ar", cuda_graph=cuda_graph)
    drafter.set_reference(ref.tokens)
    return ref.tokens[:, :max_new_tokens]


def throughput_sweep(model, prompts, max_new_tokens: int, drafter: SyntheticDrafter,
                     budgets=(1, 16, 32, 64, 128, 256, 512), chain: bool = True,
                     cuda_graph: bool = False) -> list[dict]:
    """Tokens per second and acceptance length of greedy DDTree against budget, beside greedy decoding.

    Runs greedy autoregressive decoding first (``set_greedy_reference``). Then
    DDTree at every budget, and with ``chain`` the single-chain drafter (``topk=1``,
    ``budget=draft_len``, DFlash without a tree). Every run must reproduce the greedy tokens
    (checked; in bf16 a mismatch is reported in the ``lossless`` column rather than raised).

    Returns
    -------
    list of dict
        One row per run: mode (ar, chain, ddtree), budget, tau (tokens per step), steps,
        tokens_per_s, speedup (over ar), lossless, seconds, cuda_graph.
    """
    L = drafter.draft_len
    greedy = set_greedy_reference(model, prompts, max_new_tokens, drafter, cuda_graph)
    base = generate(model, prompts, max_new_tokens, mode="ar", cuda_graph=cuda_graph)
    runs = [("ar", 0, None, base)]
    if chain:
        runs.append(("chain", L, 1, None))
    runs += [("ddtree", b, None, None) for b in budgets]
    rows = []
    for mode, budget, topk, out in runs:
        if out is None:
            out = generate(model, prompts, max_new_tokens, mode="ddtree", drafter=drafter, budget=budget,
                           topk=topk, cuda_graph=cuda_graph)
        rows.append(dict(mode=mode, budget=budget, tau=out.mean_accepted, steps=out.steps,
                         tokens_per_s=out.tokens_per_second,
                         speedup=out.tokens_per_second / base.tokens_per_second,
                         lossless=bool(torch.equal(out.tokens, greedy)), seconds=out.seconds,
                         cuda_graph=cuda_graph))
    return rows


def engine_tables(preset: str = "kimi_k2_attn", *, layers: int | None = None, drafter: str = "small",
                  batch: int = 1, prompt: int = 512, new: int = 256,
                  budgets=(1, 16, 32, 64, 128, 256, 512), breakdown_budgets=(16, 64, 256, 512),
                  accuracies=("paper", "0.7", "0.8", "0.95"), steps: int = 20, seed: int = 0):
    """Issue 5's two tables for one model: throughput against budget and the step breakdown.

    Builds the preset (bf16 on CUDA, float32 on CPU) and the synthetic drafter at each accuracy
    (``"paper"`` is its calibration to the DDTree paper, ``PAPER_MATH500_QWEN3_8B``; a number
    is a top-1 accuracy at the same spread), runs ``throughput_sweep`` per accuracy, eagerly
    and (on CUDA) under graph replay, then ``step_breakdown`` for greedy decoding and each
    breakdown budget with the first accuracy.

    Returns
    -------
    throughput, breakdown : pandas.DataFrame
        Tidy rows; ``mode`` is the timing mode (eager, graph or host) and ``decode`` the decode
        mode (ar, chain, ddtree), so the tables combine with the workbook's.
    meta : dict
        Model, drafter, calibration, device, and the best budget per accuracy and timing mode.
    """
    from dataclasses import asdict, replace

    import pandas as pd

    from kdtree.engine.config import get_config, get_drafter_config
    from kdtree.engine.drafter import PAPER_MATH500_QWEN3_8B
    from kdtree.engine.model import build_model

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cfg = get_config(preset)
    cfg = replace(cfg, n_layers=layers) if layers else cfg
    model = build_model(cfg, seed=seed, device=device, dtype=dtype)
    dcfg = get_drafter_config(drafter)

    def drafter_for(label: str) -> SyntheticDrafter:
        knobs = PAPER_MATH500_QWEN3_8B | ({} if label == "paper" else {"accuracy": float(label)})
        return SyntheticDrafter(dcfg, cfg.vocab_size, seed=seed, device=device, dtype=dtype, **knobs)

    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (prompt,), generator=gen).to(device) for _ in range(batch)]
    rows = []
    for label in accuracies:
        d = drafter_for(str(label))
        for graphed in (False, True) if cuda else (False,):
            rows += [r | {"accuracy": str(label)} for r in
                     throughput_sweep(model, prompts, new, d, list(budgets), cuda_graph=graphed)]
    through = pd.DataFrame(rows).rename(columns={"mode": "decode"})
    through["mode"] = np.where(through.pop("cuda_graph"), "graph", "eager") if cuda else "host"

    first = drafter_for(str(accuracies[0]))
    set_greedy_reference(model, prompts, new, first)
    rows = []
    for timing in ("eager", "graph") if cuda else ("eager",):
        rows += step_breakdown(model, prompts, mode="ar", steps=steps, timing=timing, max_new_tokens=new)
        for b in breakdown_budgets:
            rows += step_breakdown(model, prompts, mode="ddtree", drafter=first, budget=b, steps=steps,
                                   timing=timing, max_new_tokens=new)
    breakdown = pd.DataFrame(rows).rename(columns={"mode": "decode", "timing": "mode"})
    if not cuda:
        breakdown["mode"] = "host"
    tree = through[through.decode == "ddtree"]
    meta = dict(preset=preset, model=asdict(cfg), drafter=asdict(dcfg), calibration=PAPER_MATH500_QWEN3_8B,
                device=torch.cuda.get_device_name() if cuda else "cpu", batch=batch, prompt=prompt, new=new,
                best_budget={f"{acc}/{mode}": int(part.sort_values("tokens_per_s").iloc[-1]["budget"])
                             for (acc, mode), part in tree.groupby(["accuracy", "mode"])})
    return through, breakdown, meta

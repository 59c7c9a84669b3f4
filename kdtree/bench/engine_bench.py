"""The engine's benchmark: where a decode step's time goes, and what DDTree buys (step
breakdowns and throughput sweeps of ``kdtree.engine``).

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

Timing rules (docs/design.md, measurement rules): device time from CUDA events, warm-up first, median and spread of
many repetitions. ``timing="graph"`` captures each phase in its own graph and replays them in
order (each replay costs one graph launch, so the phases sum to a bit more than ``step``, which
is the whole step in one graph). On CPU the work is synchronous and the host clock is the
device clock.

``throughput_sweep`` times whole generations: greedy decoding, the single chain, and DDTree
per budget. The synthetic drafter's truth is the target's greedy continuation along the path
each run decodes (``self_consistent_run``): greedy decoding's output in float32, where DDTree
reproduces it exactly, and DDTree's own output in bf16, where a rounding tie of the target's
top two logits may part a run from greedy decoding and a drafter still drafting greedy
decoding's tokens would measure nothing after that point.
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np
import torch

from kdtree.bench.timing import hold_cycles_for, hold_device, host_clock
from kdtree.engine.ddtree import (Generation, capture, chain_tree, generate, make_phases, needed_capacity,
                                  run_phases, start)
from kdtree.engine.drafter import SyntheticDrafter
from kdtree.engine.model import attend


class _Clock:
    """CUDA events on a GPU, the host clock on CPU (``host``: ``kdtree.bench.timing.host_clock``'s)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.host = time.perf_counter

    def mark(self):
        if not self.cuda:
            return self.host()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) * 1e-3 if self.cuda else b - a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def _time(fns, clock: _Clock, reps: int, hold: int = 0) -> dict[str, list[float]]:
    """Seconds per named call over ``reps`` rounds of calling ``fns`` in order, plus the host time.

    ``hold`` (graph replays; cycles, ``hold_cycles_for`` the first call): each round starts behind
    ``hold_device(hold)``, so the first replay's submission by the host is not timed (the later
    ones queue behind the earlier replays)."""
    out = {name: [] for name, _ in fns} | {"host": []}
    with host_clock() as host:
        clock.host = host
        for _ in range(reps):
            if hold:
                hold_device(hold)
            marks, t0 = [clock.mark()], host()
            for _, fn in fns:
                fn()
                marks.append(clock.mark())
            out["host"].append(host() - t0)
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


class _Breakdown:
    """One step breakdown's engine, warmed up, timed in rounds of ``steps`` steps (``step_breakdown``)."""

    @torch.no_grad()
    def __init__(self, model, prompts, mode, drafter, budget, topk, steps, warmup, timing, max_new_tokens,
                 capacity):
        if timing not in ("eager", "graph"):
            raise ValueError(f"timing: expected 'eager' or 'graph', got {timing!r}")
        for name, value in (("steps", steps), ("warmup", warmup)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        state, phases = start(model, prompts, max_new_tokens, mode, drafter, budget, topk, capacity)
        self.clock = clock = _Clock(state.root.device)
        if timing == "graph" and not clock.cuda:
            raise ValueError(f"timing: 'graph' needs a CUDA model, the model is on {state.root.device}")
        self.mode, self.timing, self.steps, self.budget, self.batch = mode, timing, steps, budget, state.cache.batch
        self.layers, self.phases, self.rounds = model.cfg.n_layers, phases, []
        for _ in range(warmup):
            run_phases(phases)
        if timing == "graph":
            self.whole = capture(lambda: run_phases(make_phases(model, state, mode, drafter, budget, topk)), warmup=1)
            self.whole.replay()   # one untimed replay: the first one of a new graph runs slow
            self.graphs = _graphs(phases)
        # The attention share of verify, at this step's shapes.
        cfg, kv = model.cfg, state.cache.kv[0]
        N = 1 if mode == "ar" else budget + 1
        tree = chain_tree(torch.full((self.batch,), N, device=kv.device), N)
        q = torch.randn(self.batch, N, cfg.n_heads, cfg.latent_dim, device=kv.device).to(kv.dtype)
        call = [("attention", lambda: attend(q, kv, state.cache.lengths, tree, cfg.softmax_scale, cfg.kv_lora_rank))]
        for _ in range(warmup):
            call[0][1]()
        self.attention = call if timing == "eager" else _graphs(call)
        self.holds = dict.fromkeys(("step", "phases", "attention"), 0)   # eager: no hold
        if timing == "graph":   # each timing's first replay
            self.holds = {"step": hold_cycles_for(self.whole.replay), "phases": hold_cycles_for(self.graphs[0][1]),
                          "attention": hold_cycles_for(self.attention[0][1])}

    @torch.no_grad()
    def round(self) -> None:
        """Time ``steps`` more steps, each phase alone, and the attention share."""
        clock, steps = self.clock, self.steps
        if self.timing == "eager":
            times = _time(self.phases, clock, steps)
            times["step"] = [sum(parts) for parts in zip(*(times[name] for name, _ in self.phases))]
        else:
            times = _time([("step", self.whole.replay)], clock, steps, hold=self.holds["step"])
            times |= {k: v for k, v in _time(self.graphs, clock, steps, hold=self.holds["phases"]).items()
                      if k != "host"}
        att = _time(self.attention, clock, steps, hold=self.holds["attention"])["attention"]
        times["verify.attention"] = [t * self.layers for t in att]
        times["verify.rest"] = [v - a for v, a in zip(times["verify"], times["verify.attention"])]
        self.rounds.append(times)

    def rows(self) -> list[dict]:
        """The quietest round's rows (the one with the lowest median step time); the host row
        from the host's own quietest round (under graph replay the step is device time, and
        its quietest round says nothing of the host's)."""
        times = dict(min(self.rounds, key=lambda t: float(np.median(t["step"]))))
        times["host"] = min((t["host"] for t in self.rounds), key=lambda h: float(np.median(h)))
        rows = []
        for phase, secs in times.items():
            us = np.asarray(secs) * 1e6
            rows.append(dict(mode=self.mode, timing=self.timing, phase=phase,
                             budget=self.budget if self.mode == "ddtree" else 0, batch=self.batch, steps=self.steps,
                             median_us=float(np.median(us)), p20_us=float(np.percentile(us, 20)),
                             p80_us=float(np.percentile(us, 80))))
        return rows


def _check_rounds(rounds) -> None:
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds: expected a positive int, got {rounds!r}")


def _take_rounds(breakdowns: list[_Breakdown], rounds: int) -> None:
    """``rounds`` rounds of every breakdown, alternating (round 0 of each, then round 1, ...), so
    each one's rounds spread over the whole measurement (``kdtree.bench.timing.Rounds``' reason)."""
    for _ in range(rounds):
        for b in breakdowns:
            b.round()


def step_breakdown(model, prompts, mode: str = "ddtree", drafter=None, budget: int = 64,
                   topk: int | None = None, steps: int = 20, warmup: int = 3, timing: str = "eager",
                   max_new_tokens: int = 128, capacity: int | None = None, rounds: int = 1) -> list[dict]:
    """Time each phase of a decode step.

    Parameters
    ----------
    model, prompts, mode, drafter, budget, topk
        As for ``generate``. Steps run at the acceptance the drafter's reference gives, so for
        realistic acceptance in bf16 give the drafter the reference of a self-consistent run
        at this budget (``throughput_sweep``'s ``references``, or ``self_consistent_run``):
        with the greedy tokens as its truth, a run that parted from them at a rounding tie
        would step on at chance acceptance (``engine_tables`` does this).
    steps, warmup : int
        Timed steps per round and untimed steps (sequences that reach ``max_new_tokens`` keep
        stepping with the same static work, so any number of steps is fine).
    timing : {"eager", "graph"}
        Eager launches, or CUDA-graph replay (CUDA only).
    max_new_tokens, capacity : int
        As for ``generate``; to step along the path of a ``throughput_sweep`` run, pass its
        ``measured_capacity``.
    rounds : int
        Rounds of ``steps`` steps; the rows are the quietest round's (lowest median step): an
        eager step is mostly the host's work, whose speed moves for stretches of seconds.
        ``engine_tables`` alternates the rounds of all its breakdowns.

    Returns
    -------
    list of dict
        One row per phase: mode, timing, phase, budget, batch, steps, median_us, p20_us, p80_us.
    """
    _check_rounds(rounds)
    b = _Breakdown(model, prompts, mode, drafter, budget, topk, steps, warmup, timing, max_new_tokens, capacity)
    _take_rounds([b], rounds)
    return b.rows()


def measured_capacity(prompts, max_new_tokens: int, draft_len: int, mode: str = "ddtree", budget: int = 0) -> int:
    """Cache rows of a measured run of ``max_new_tokens``: those of a run ``draft_len`` tokens
    longer, which decodes the same path (the cache size is part of the numerics, see
    ``generate``) and extends it far enough to be a drafter reference. ``budget`` is the
    run's (``draft_len`` for the chain); ignored for ``mode="ar"``."""
    return needed_capacity(prompts, max_new_tokens + draft_len, mode, budget, draft_len)


def set_greedy_reference(model, prompts, max_new_tokens: int, drafter: SyntheticDrafter,
                         cuda_graph: bool = False) -> torch.Tensor:
    """Decode greedily ``max_new_tokens + draft_len`` tokens (so the last drafts are covered too),
    make that the synthetic drafter's reference, and return the first ``max_new_tokens`` [B, T]."""
    ref = generate(model, prompts, max_new_tokens + drafter.draft_len, mode="ar", cuda_graph=cuda_graph,
                   capacity=measured_capacity(prompts, max_new_tokens, drafter.draft_len, "ar"))
    drafter.set_reference(ref.tokens)
    return ref.tokens[:, :max_new_tokens]


def self_consistent_run(model, prompts, max_new_tokens: int, drafter: SyntheticDrafter,
                        reference: torch.Tensor, budget: int, topk: int | None = None,
                        cuda_graph: bool = False, max_rounds: int = 8) -> tuple[Generation, torch.Tensor, int]:
    """A DDTree run whose synthetic drafter drafts the continuation the run itself decodes.

    The drafter's truth must be the target's greedy continuation along the path the measured
    run decodes, or its acceptance means nothing (see ``kdtree.engine.drafter``). In float32
    that is greedy autoregressive decoding's output, and the first round agrees. In bf16 a
    DDTree run may part from it at a rounding tie; from there on, a drafter fed the
    autoregressive tokens drafts for a context the run no longer has. So: draft from
    ``reference``, run DDTree (timed); if its tokens equal the reference's first
    ``max_new_tokens``, done. Otherwise run DDTree again for ``max_new_tokens + draft_len``
    tokens from the same reference and with the same cache size (``measured_capacity``), so
    it decodes the same path and then goes on: the target's greedy decisions along the path
    the run decodes, under the verify's numerics, far enough past the end to cover the last
    drafts. Adopt that as the reference and repeat, at most ``max_rounds`` rounds. A round
    that does not agree costs two runs. Convergence is usual but not guaranteed (a new
    reference changes the trees, and with them the rounding at the next tie), so the caller
    gets the rounds taken and can check agreement itself.

    Parameters
    ----------
    model, prompts, max_new_tokens, budget, topk, cuda_graph
        As for ``generate`` (mode ``"ddtree"``).
    drafter : SyntheticDrafter
        Its reference is replaced (left at the returned one).
    reference : int tensor [B, >= max_new_tokens]
        The starting truth: greedy autoregressive output of ``max_new_tokens + draft_len``
        tokens (``set_greedy_reference``).
    max_rounds : int

    Returns
    -------
    generation : Generation
        The last round's timed run of ``max_new_tokens``.
    reference : int64 [B, max_new_tokens + draft_len]
        The reference that run drafted from; the run is self-consistent iff
        ``torch.equal(generation.tokens, reference[:, :max_new_tokens])``.
    rounds : int
        Rounds run, 1..max_rounds.
    """
    if not isinstance(max_rounds, int) or isinstance(max_rounds, bool) or max_rounds < 1:
        raise ValueError(f"max_rounds: expected a positive int, got {max_rounds!r}")
    if not isinstance(reference, torch.Tensor) or reference.dim() != 2 or reference.shape[1] < max_new_tokens:
        raise ValueError(f"reference: expected a tensor [B, >= max_new_tokens={max_new_tokens}] of tokens")
    L = drafter.draft_len
    run = partial(generate, model, prompts, mode="ddtree", drafter=drafter, budget=budget, topk=topk,
                  cuda_graph=cuda_graph, capacity=measured_capacity(prompts, max_new_tokens, L, "ddtree", budget))
    for rounds in range(1, max_rounds + 1):
        drafter.set_reference(reference)
        out = run(max_new_tokens)
        if rounds == max_rounds or torch.equal(out.tokens, drafter.reference[:, :max_new_tokens]):
            break
        reference = run(max_new_tokens + L).tokens
    return out, drafter.reference, rounds


def _agreement(tokens: torch.Tensor, greedy: torch.Tensor) -> dict:
    """lossless, agree_ar and first_divergence of ``tokens`` [B, T] against greedy output [B, T]."""
    same = tokens == greedy
    parted = ~same.all(1)
    first = (~same).int().argmax(1)[parted]  # each parted sequence's first differing index
    return {"lossless": not bool(parted.any()), "agree_ar": float(same.float().mean()),
            "first_divergence": int(first.min()) if bool(parted.any()) else -1}


def throughput_sweep(model, prompts, max_new_tokens: int, drafter: SyntheticDrafter,
                     budgets=(1, 16, 32, 64, 128, 256, 512), chain: bool = True,
                     cuda_graph: bool = False, max_rounds: int = 8,
                     references: dict | None = None) -> list[dict]:
    """Tokens per second and acceptance length of greedy DDTree against budget, beside greedy decoding.

    Runs greedy autoregressive decoding first (``set_greedy_reference``). Then DDTree at every
    budget, and with ``chain`` the single-chain drafter (``topk=1``, ``budget=draft_len``,
    DFlash without a tree), each through ``self_consistent_run`` from the greedy reference:
    the drafter's truth is the target's greedy continuation along the path the run decodes.
    In float32 that is the greedy output itself (one round, every row lossless). In bf16 a
    run may part from greedy decoding at a rounding tie; it is then measured against its own
    output, and the ``lossless``, ``agree_ar`` and ``first_divergence`` columns say how far it
    followed greedy decoding (a mismatch is reported, not raised). Every run's cache has
    ``measured_capacity`` rows, so the timed greedy run decodes its reference's path exactly.

    Parameters
    ----------
    max_rounds : int
        Cap on ``self_consistent_run``'s rounds.
    references : dict, optional
        Filled with the final drafter reference of each run, keyed ``(decode, budget,
        cuda_graph)``, so a step breakdown can run at the same acceptance.

    Returns
    -------
    list of dict
        One row per run: mode (ar, chain, ddtree), budget, tau (tokens per step), steps,
        tokens_per_s, speedup (over ar), lossless (the tokens equal greedy decoding's),
        agree_ar (the fraction of new tokens equal to greedy decoding's), first_divergence
        (the first index at which any sequence parts from greedy decoding, -1 if none),
        reference_rounds (0 for ar), self_consistent (the tokens equal the reference the
        drafter drafted from; False only when ``max_rounds`` ran out), seconds, cuda_graph.
    """
    L = drafter.draft_len
    greedy = set_greedy_reference(model, prompts, max_new_tokens, drafter, cuda_graph)
    start_ref = drafter.reference
    base = generate(model, prompts, max_new_tokens, mode="ar", cuda_graph=cuda_graph,
                    capacity=measured_capacity(prompts, max_new_tokens, L, "ar"))
    runs = [("chain", L, 1)] if chain else []
    runs += [("ddtree", b, None) for b in budgets]
    runs_out = [("ar", 0, base, 0, True)]
    for mode, budget, topk in runs:
        out, ref, rounds = self_consistent_run(model, prompts, max_new_tokens, drafter, start_ref, budget, topk,
                                               cuda_graph, max_rounds)
        if references is not None:
            references[(mode, budget, cuda_graph)] = ref
        runs_out.append((mode, budget, out, rounds, torch.equal(out.tokens, ref[:, :max_new_tokens])))
    return [{"mode": mode, "budget": budget, "tau": out.mean_accepted, "steps": out.steps,
             "tokens_per_s": out.tokens_per_second, "speedup": out.tokens_per_second / base.tokens_per_second,
             **_agreement(out.tokens, greedy), "reference_rounds": rounds, "self_consistent": bool(consistent),
             "seconds": out.seconds, "cuda_graph": cuda_graph}
            for mode, budget, out, rounds, consistent in runs_out]


def engine_tables(preset: str = "kimi_k2_attn", *, layers: int | None = None, drafter: str = "small",
                  batch: int = 1, prompt: int = 512, new: int = 256,
                  budgets=(1, 16, 32, 64, 128, 256, 512), breakdown_budgets=(16, 64, 256, 512),
                  accuracies=("paper", "0.7", "0.8", "0.95"), steps: int = 20, rounds: int = 5, seed: int = 0,
                  max_rounds: int = 16):
    """The engine's two tables for one model: throughput against budget and the step breakdown.

    Builds the preset (bf16 on CUDA, float32 on CPU) and the synthetic drafter at each accuracy
    (``"paper"`` is its calibration to the DDTree paper, ``PAPER_MATH500_QWEN3_8B``; a number
    is a top-1 accuracy at the same spread), runs ``throughput_sweep`` per accuracy, eagerly
    and (on CUDA) under graph replay, then ``step_breakdown`` for greedy decoding and each
    breakdown budget with the first accuracy (``rounds`` rounds of ``steps`` steps each, the
    rounds of all breakdowns of a timing mode alternating; each reports its quietest round, as
    ``step_breakdown`` says). Every DDTree measurement drafts from the
    target's greedy continuation along the path the run decodes (``self_consistent_run``):
    greedy decoding's output in float32, DDTree's own in bf16, where a rounding tie may part
    the two; the throughput table's ``lossless``, ``agree_ar``, ``first_divergence`` and
    ``reference_rounds`` columns show it. ``max_rounds`` caps the rounds per run (8 left
    budgets 128 and 512 of ``kimi_k2_attn`` unsettled on an H200: deep trees meet more ties).

    Returns
    -------
    throughput, breakdown : pandas.DataFrame
        Tidy rows; ``mode`` is the timing mode (eager, graph or host) and ``decode`` the decode
        mode (ar, chain, ddtree), so the tables combine with the workbook's.
    meta : dict
        Model, drafter, calibration, device, what the drafter's reference is, and the best
        budget per accuracy and timing mode.
    """
    from dataclasses import asdict, replace

    import pandas as pd

    from kdtree.engine.config import get_config, get_drafter_config
    from kdtree.engine.drafter import PAPER_MATH500_QWEN3_8B
    from kdtree.engine.model import build_model

    _check_rounds(rounds)
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
    rows, drafters, references = [], {}, {}
    for label in map(str, accuracies):
        d = drafters[label] = drafter_for(label)
        for graphed in (False, True) if cuda else (False,):
            rows += [r | {"accuracy": label} for r in
                     throughput_sweep(model, prompts, new, d, list(budgets), cuda_graph=graphed,
                                      max_rounds=max_rounds, references=references.setdefault(label, {}))]
    through = pd.DataFrame(rows).rename(columns={"mode": "decode"})
    graphed = through.pop("cuda_graph")
    through["mode"] = np.where(graphed, "graph", "eager") if cuda else "host"

    # The breakdown steps at the acceptance of the sweep's self-consistent runs at that budget,
    # each budget with a drafter of its own (its reference stays put while the rounds alternate).
    label = str(accuracies[0])
    first, refs, greedy = drafters[label], references[label], None
    own = {b: drafter_for(label) for b in breakdown_budgets}
    rows = []
    for timing in ("eager", "graph") if cuda else ("eager",):
        runs = [_Breakdown(model, prompts, "ar", None, 1, None, steps, 3, timing, new,
                           measured_capacity(prompts, new, dcfg.draft_len, "ar"))]
        for b in breakdown_budgets:
            key = ("ddtree", b, timing == "graph")
            if key not in refs:  # a budget the sweep did not run
                if greedy is None:
                    set_greedy_reference(model, prompts, new, first)
                    greedy = first.reference
                refs[key] = self_consistent_run(model, prompts, new, first, greedy, b, cuda_graph=key[2],
                                                max_rounds=max_rounds)[1]
            own[b].set_reference(refs[key])
            runs.append(_Breakdown(model, prompts, "ddtree", own[b], b, None, steps, 3, timing, new,
                                   measured_capacity(prompts, new, dcfg.draft_len, "ddtree", b)))
        _take_rounds(runs, rounds)
        rows += [row for run in runs for row in run.rows()]
        del runs
    breakdown = pd.DataFrame(rows).rename(columns={"mode": "decode", "timing": "mode"})
    if not cuda:
        breakdown["mode"] = "host"
    tree = through[through.decode == "ddtree"]
    meta = dict(preset=preset, model=asdict(cfg), drafter=asdict(dcfg), calibration=PAPER_MATH500_QWEN3_8B,
                device=torch.cuda.get_device_name() if cuda else "cpu", batch=batch, prompt=prompt, new=new,
                drafter_reference="the target's greedy continuation along each run's decoded path "
                                  "(self_consistent_run): greedy decoding's output where the run is lossless",
                best_budget={f"{acc}/{mode}": int(part.sort_values("tokens_per_s").iloc[-1]["budget"])
                             for (acc, mode), part in tree.groupby(["accuracy", "mode"])})
    return through, breakdown, meta

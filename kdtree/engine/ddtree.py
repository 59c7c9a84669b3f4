"""The decode loop: greedy autoregressive decoding (the baseline) and the DDTree step.

One DDTree step, for all sequences at once:

    drafter.draft -> topk_logprobs -> build_tree -> target forward over the tree (verify)
    -> argmax at every node -> accept_tree -> compact_kv (all layers in one launch)
    -> write the accepted tokens and the bonus -> next root = bonus

Greedy DDTree is lossless: every emitted token is the target's argmax given the tokens before
it, exactly what greedy autoregressive decoding emits. On CPU in float32 the two agree token
for token (``tests/test_engine.py``); in bf16 they may part only where the target's top two
logits are within rounding of each other (``tests/test_engine_gpu.py``), which is why the
measurements give the synthetic drafter the continuation the measured run decodes as its truth
(``kdtree.engine.drafter``).

Static shapes throughout. Sequences that reach ``max_new_tokens`` keep stepping (their tree
rows land past the committed prefix and are never committed) but stop emitting, so a batch
needs no host-side bookkeeping between steps. That, ``validate=False`` in the kdtree calls and
device-side counters are what let ``cuda_graph=True`` capture the whole step, once per
``generate`` call (one graph per budget), after ``warmup`` eager steps run on a side stream.
The only host synchronisation is the loop's "everyone done?" check between steps.

Graph replay emits exactly what the eager step does (``tests/test_engine_gpu.py``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from kdtree.engine.cache import KVCache, allocate_cache
from kdtree.engine.drafter import Drafter
from kdtree.engine.model import Transformer
from kdtree.tree import MAX_BUDGET, MAX_DEPTH, MAX_TOPK, Tree, accept_tree, build_tree, compact_kv, topk_logprobs

MODES = ("ar", "ddtree")


@dataclass
class DecodeState:
    """Everything a step reads and writes, in static device tensors (graph-capturable).

    Attributes
    ----------
    cache : KVCache
        ``cache.lengths[b]`` counts the committed rows; the root's row is not yet among them.
    root : int64 [B]
        The last emitted token, whose KV row the next step computes.
    out : int64 [B, max_new + L + 2]
        Emitted tokens; the last column takes the writes of finished sequences.
    n_out : int64 [B]
        Tokens emitted so far, the root included.
    accepted : int64 [max_new, B]
        Tokens emitted per step (the DDTree acceptance length, bonus included); 0 once done.
    step : int64 [1]
        Steps taken (a device counter, so replays advance it).
    single : Tree
        The one-node tree an autoregressive step verifies.
    max_new : int
    """

    cache: KVCache
    root: torch.Tensor
    out: torch.Tensor
    n_out: torch.Tensor
    accepted: torch.Tensor
    step: torch.Tensor
    single: Tree
    max_new: int


@dataclass
class Generation:
    """The result of ``generate``.

    Attributes
    ----------
    tokens : int64 [B, max_new_tokens]
        The new tokens of each sequence (the prompt excluded).
    accepted : int64 [steps, B]
        Tokens emitted per step and sequence (0 after a sequence finished).
    seconds : float
        Wall time of the timed decode steps, host overhead and the per-step "done?" check
        included (synchronised at the end); prefill, the warm-up steps and the graph capture
        excluded.
    untimed_steps : int
        Warm-up steps before the clock started (their tokens are in ``tokens`` all the same).
    """

    tokens: torch.Tensor
    accepted: torch.Tensor
    seconds: float
    untimed_steps: int = 0

    @property
    def steps(self) -> int:
        return self.accepted.shape[0]

    @property
    def tokens_per_second(self) -> float:
        """Tokens emitted by all sequences in the timed steps, per second."""
        return float(self.accepted[self.untimed_steps:].sum()) / self.seconds

    @property
    def mean_accepted(self) -> float:
        """Average tokens per step over the steps in which each sequence was still decoding."""
        live = self.accepted > 0
        return float(self.accepted[live].float().mean())


def chain_tree(lengths: torch.Tensor, nodes: int) -> Tree:
    """Chains as a Tree: prefill's causal mask, and (one node) a decode step's.

    Parameters
    ----------
    lengths : int tensor [B]
        Real nodes per sequence, 1..nodes.
    nodes : int
        N, rows per sequence (the rest are padding: parent and depth -1, no visibility).

    Returns
    -------
    Tree
        Node i's parent is i - 1 and its visibility covers nodes 0..i; built with tensor ops on
        ``lengths``' device (no host loop, unlike ``Tree.from_parents``).
    """
    dev = lengths.device
    i = torch.arange(nodes, device=dev)
    real = i[None, :] < lengths[:, None]
    parents = torch.where(real & (i > 0), i - 1, -1).to(torch.int32)
    depth = torch.where(real, i, -1).to(torch.int32)
    W = (nodes + 63) // 64
    seen = torch.zeros(lengths.shape[0], nodes, W * 64, dtype=torch.bool, device=dev)
    seen[:, :, :nodes] = real[:, :, None] & (i[None, None, :] <= i[None, :, None])
    bits = seen.view(-1, nodes, W, 64).long() << torch.arange(64, device=dev)
    return Tree(torch.where(real, 0, -1).to(torch.int32), parents, depth,
                lengths.to(torch.int32), bits.sum(-1), nodes - 1)


def _check_generate(model, prompts, max_new_tokens, mode, drafter, budget, topk):
    if not isinstance(model, Transformer):
        raise TypeError(f"model: expected a kdtree.engine Transformer, got {type(model).__name__}")
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: expected a non-empty list of 1-D token tensors")
    V = model.cfg.vocab_size
    for b, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.numel() == 0 or p.is_floating_point():
            raise ValueError(f"prompts[{b}]: expected a non-empty 1-D integer tensor")
        if int(p.min()) < 0 or int(p.max()) >= V:
            raise ValueError(f"prompts[{b}]: token ids must lie in 0..{V - 1}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if mode == "ddtree":
        if drafter is None:
            raise ValueError("drafter: mode='ddtree' needs a drafter")
        if not 1 <= drafter.draft_len <= MAX_DEPTH:
            raise ValueError(f"drafter: draft_len must be in 1..{MAX_DEPTH}, got {drafter.draft_len}")
        if not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= MAX_BUDGET:
            raise ValueError(f"budget: expected an int in 1..{MAX_BUDGET}, got {budget!r}")
        if topk is not None and (not isinstance(topk, int) or not 1 <= topk <= min(V, MAX_TOPK)):
            raise ValueError(f"topk: expected an int in 1..{min(V, MAX_TOPK)}, got {topk!r}")


@torch.no_grad()
def prefill(model: Transformer, prompts: list[torch.Tensor], capacity: int, max_new: int,
            draft_len: int) -> DecodeState:
    """Run the prompts and return the decode state after the first new token.

    Parameters
    ----------
    model : Transformer
    prompts : list of 1-D integer tensors
        Right-padded into one chain per sequence; every prompt row goes to the cache.
    capacity : int
        Cache rows per sequence.
    max_new, draft_len : int
        Size the output buffer (``max_new + draft_len + 2`` columns).

    Returns
    -------
    DecodeState
        ``cache.lengths`` = prompt lengths, root = the first new token (already in ``out``).
    """
    dev = model.embed.weight.device
    B = len(prompts)
    lens = torch.tensor([p.numel() for p in prompts], device=dev)
    T = int(lens.max())
    cache = allocate_cache(model.cfg, B, capacity, dev, model.embed.weight.dtype)
    tokens = torch.full((B, T), -1, dtype=torch.int64, device=dev)
    for b, p in enumerate(prompts):
        tokens[b, :p.numel()] = p.to(dev)
    first = model(tokens, chain_tree(lens, T), cache, nodes=lens - 1).argmax(-1)
    cache.lengths.copy_(lens)
    out = torch.zeros((B, max_new + draft_len + 2), dtype=torch.int64, device=dev)
    out[:, 0] = first
    return DecodeState(cache, first.clone(), out, torch.ones(B, dtype=torch.int64, device=dev),
                       torch.zeros((max_new, B), dtype=torch.int64, device=dev),
                       torch.zeros(1, dtype=torch.int64, device=dev),
                       chain_tree(torch.ones(B, dtype=torch.int64, device=dev), 1), max_new)


def _advance(state: DecodeState, new: torch.Tensor, count: torch.Tensor, bonus: torch.Tensor) -> None:
    """Emit ``new[b, :count[b]]`` for live sequences, commit as many rows, make ``bonus`` the root."""
    live = state.n_out < state.max_new
    count = torch.where(live, count.long(), 0)
    M = new.shape[1]
    col = state.n_out[:, None] + torch.arange(M, device=new.device)
    keep = torch.arange(M, device=new.device)[None, :] < count[:, None]
    state.out.scatter_(1, torch.where(keep, col, state.out.shape[1] - 1), new.long())
    state.n_out.add_(count)
    state.cache.lengths.add_(count)
    state.root.copy_(torch.where(live, bonus.long(), state.root))
    state.accepted.index_copy_(0, state.step.clamp(max=state.max_new - 1), count[None])
    state.step.add_(1)


def ar_phases(model: Transformer, state: DecodeState) -> list[tuple[str, Callable[[], None]]]:
    """One greedy autoregressive step as phases: verify the one-node tree {root}, emit its argmax."""
    s = {}

    def verify():
        s["next"] = model(state.root[:, None], state.single, state.cache).argmax(-1)   # [B, 1]

    def commit():
        _advance(state, s["next"], torch.ones_like(state.root), s["next"][:, 0])

    return [("verify", verify), ("commit", commit)]


def ddtree_phases(model: Transformer, drafter: Drafter, state: DecodeState, budget: int,
                  topk: int) -> list[tuple[str, Callable[[], None]]]:
    """The DDTree step as named phases that pass their outputs on through a scratch dict.

    ``run_phases`` runs them in order: one step (see the module docstring). ``step_breakdown``
    times them one by one, eagerly or each captured in its own CUDA graph. No phase
    synchronises with the host.
    """
    cache, s = state.cache, {}

    def draft():
        s["logits"] = drafter.draft(state.root, cache.lengths, state.n_out)

    def top_k():
        s["logprobs"], s["tokens"] = topk_logprobs(s["logits"], topk, validate=False)

    def build():
        s["tree"] = build_tree(s["logprobs"], s["tokens"], budget, root_tokens=state.root, validate=False)

    def verify():
        s["target"] = model(s["tree"].tokens, s["tree"], cache).argmax(-1)    # [B, N]

    def accept():
        s["acc"] = accept_tree(s["tree"], s["target"], validate=False)

    def compact():
        compact_kv(cache.kv, cache.lengths, s["acc"], validate=False)

    def commit():
        acc = s["acc"]
        path = s["tree"].tokens.gather(1, acc.indices.clamp_min(0).long())   # [B, L + 1], root first
        new = torch.cat((path[:, 1:], path[:, :1]), dim=1).long()
        new.scatter_(1, (acc.length.long() - 1)[:, None], acc.bonus.long()[:, None])
        _advance(state, new, acc.length, acc.bonus)

    return [("draft", draft), ("topk", top_k), ("build", build), ("verify", verify),
            ("accept", accept), ("compact", compact), ("commit", commit)]


@torch.no_grad()
def run_phases(phases: list[tuple[str, Callable[[], None]]]) -> None:
    """Run a step's phases in order."""
    for _, phase in phases:
        phase()


def capture(step, warmup: int = 2) -> torch.cuda.CUDAGraph:
    """Capture ``step`` in a CUDA graph after ``warmup`` real steps on a side stream.

    The warm-up compiles kernels and sizes workspaces; capturing records without executing,
    so no step is lost or repeated. Replaying the returned graph runs one step.

    Parameters
    ----------
    step : callable
        No arguments, no host synchronisation (``run_phases`` of ``start``'s phases).
    warmup : int

    Returns
    -------
    torch.cuda.CUDAGraph
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def needed_capacity(prompts: list[torch.Tensor], max_new_tokens: int, mode: str = "ar", budget: int = 64,
                    draft_len: int = 0) -> int:
    """Cache rows per sequence a run needs: the longest prompt, every new token, and one step's
    tree rows past the prefix (``budget + 1 + draft_len`` for DDTree, one for greedy decoding)."""
    return max(p.numel() for p in prompts) + max_new_tokens + (budget + 1 + draft_len if mode == "ddtree" else 1)


def start(model: Transformer, prompts: list[torch.Tensor], max_new_tokens: int, mode: str = "ar",
          drafter: Drafter | None = None, budget: int = 64, topk: int | None = None,
          capacity: int | None = None) -> tuple[DecodeState, list[tuple[str, Callable[[], None]]]]:
    """Check the arguments, prefill, and return the decode state with its step's phases.

    Parameters are those of ``generate``. ``run_phases(phases)`` is one step: it advances
    ``state`` in place and never synchronises with the host, so it can be captured.
    """
    _check_generate(model, prompts, max_new_tokens, mode, drafter, budget, topk)
    L = drafter.draft_len if mode == "ddtree" else 0
    need = needed_capacity(prompts, max_new_tokens, mode, budget, L)
    if capacity is None:
        capacity = need
    elif not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < need:
        raise ValueError(f"capacity: expected an int >= {need} (this run's rows per sequence), got {capacity!r}")
    state = prefill(model, list(prompts), capacity, max_new_tokens, L)
    return state, make_phases(model, state, mode, drafter, budget, topk)


def make_phases(model: Transformer, state: DecodeState, mode: str, drafter: Drafter | None = None,
                budget: int = 64, topk: int | None = None) -> list[tuple[str, Callable[[], None]]]:
    """The phases of one ``mode`` step on ``state`` (``topk`` defaults to min(budget, vocab))."""
    if mode == "ar":
        return ar_phases(model, state)
    return ddtree_phases(model, drafter, state, budget, topk or min(budget, model.cfg.vocab_size, MAX_TOPK))


def generate(model: Transformer, prompts: list[torch.Tensor], max_new_tokens: int, mode: str = "ar",
             drafter: Drafter | None = None, budget: int = 64, topk: int | None = None,
             cuda_graph: bool = False, warmup: int = 2, capacity: int | None = None) -> Generation:
    """Greedy generation, autoregressive or DDTree, for a batch of prompts of any lengths.

    Parameters
    ----------
    model : Transformer
        The target (``build_model``); its device and dtype are used throughout.
    prompts : list of 1-D integer tensors
        One prompt per sequence; lengths may differ.
    max_new_tokens : int
        New tokens per sequence.
    mode : {"ar", "ddtree"}
        Greedy autoregressive decoding or DDTree speculative decoding.
    drafter : Drafter, optional
        Required for ``"ddtree"`` (a ``SyntheticDrafter`` needs ``set_reference`` first).
    budget : int
        DDTree tree budget (non-root nodes), 1..1024.
    topk : int, optional
        Draft candidates per position; default ``min(budget, vocab)``. ``topk=1`` with
        ``budget=draft_len`` is the single-chain drafter (DFlash without a tree).
    cuda_graph : bool
        Capture the step in a CUDA graph and replay it (CUDA only).
    warmup : int
        Steps run before the clock starts (first launches compile kernels); they emit tokens
        like any other step. Under ``cuda_graph`` they run on a side stream before the capture.
    capacity : int, optional
        Cache rows per sequence; default (and minimum) ``needed_capacity``. The row count is
        part of the numerics: the CUDA attention kernels pick their KV split count from it and
        the float32 attention reduces over all of it, so it changes rounding. Runs that must
        decode the same path in bf16 (a measured run and a longer one that extends it) should
        pass the same capacity.

    Returns
    -------
    Generation
    """
    dev = model.embed.weight.device if isinstance(model, Transformer) else None
    if cuda_graph and (dev is None or dev.type != "cuda"):
        raise ValueError(f"cuda_graph: needs a CUDA model, the model is on {dev}")
    if not isinstance(warmup, int) or warmup < int(cuda_graph):
        raise ValueError(f"warmup: expected an int >= {int(cuda_graph)} (a graph needs a warm-up step), "
                         f"got {warmup!r}")
    state, phases = start(model, prompts, max_new_tokens, mode, drafter, budget, topk, capacity)
    step = partial(run_phases, phases)
    if cuda_graph:
        graph = capture(step, warmup)
    else:
        graph = None
        for _ in range(warmup):
            step()
    untimed = int(state.step)
    t0 = time.perf_counter()
    while int(state.n_out.min()) < max_new_tokens:
        graph.replay() if graph is not None else step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    steps = int(state.step)
    return Generation(state.out[:, :max_new_tokens].clone(), state.accepted[:steps].clone(), seconds, untimed)

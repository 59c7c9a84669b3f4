"""A step model of DDTree on n GPUs: measured components times layer counts, plus modelled links.

One DDTree step verifies T = batch x (budget + 1) tree tokens; greedy decoding verifies
T = batch. The step's time on one GPU of an n-GPU deployment is predicted as the sum of

* per layer (times the layer count): attention at the shard's heads (the engine's MLA block,
  projections and ``kdtree.verify_attention`` at the step's prefix), the FFN (the MoE of
  ``kdtree.bench.moe`` on MoE layers, the dense SwiGLU on the dense ones), two RMSNorms and
  residual adds, and the TP / EP communication;
* per step: embedding, final norm, LM head and argmax; the drafter, top-K, tree build, accept,
  KV compaction and commit (the engine's own phases, ``kdtree.engine.ddtree``).

Every component except the communication is MEASURED in the run (graph replay on a GPU, host
clock on CPU) at the step's shapes (``measure_components``). The communication is MODELLED
from a stated link (``Link``: bandwidth and latency per collective): a ring all-reduce of the
T x hidden activations after attention and after the FFN (``comm="allreduce"``: TP attention
leaves every token on every GPU, each EP rank computes its local experts for all of them, the
combine is an all-reduce), or a reduce-scatter and all-gather around an all-to-all dispatch and
combine of the routed slots (``comm="alltoall"``). DDTree's speedup over greedy decoding at a
budget is ``tau(budget) x step(greedy) / step(budget)``, with ``tau`` the acceptance length:
by default the DDTree paper's budget sweep (``PAPER_TAU``), or the engine's measured one
(``engine_tau``).

Two models: Kimi K2 (``kimi_k2_ep8`` and the like: MLA + MoE, one GPU's share) and a dense
model of the paper's shape (``QWEN3_8B``: GQA attention through PyTorch's SDPA over prefix
plus tree, the tree mask left out; one GPU).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd
import torch
from torch import nn

from kdtree.attention import verify_attention
from kdtree.bench.engine_bench import step_breakdown
from kdtree.bench.timing import HOST_MIN_S, Rounds, Timing, time_graph, time_host
from kdtree.engine.config import MODEL_PRESETS, ModelConfig, fitting_layers, get_config, get_drafter_config
from kdtree.engine.ddtree import chain_tree, run_phases, start
from kdtree.engine.drafter import SyntheticDrafter
from kdtree.engine.model import MoE, RMSNorm, SwiGLU, build_model

# The DDTree paper (arXiv 2604.12989), MATH-500, Qwen3-8B, T = 0, read off its Fig. 3:
# acceptance length against budget, and the single chain (DFlash, 15 deep).
PAPER_TAU = {16: 8.6, 32: 9.25, 64: 9.75, 128: 10.2, 256: 10.4, 512: 10.7, 1024: 11.0}
PAPER_TAU_CHAIN = 7.8
BUDGETS = tuple(PAPER_TAU)


@dataclass(frozen=True)
class DenseConfig:
    """A dense GQA decoder's shapes (one GPU).

    Attributes
    ----------
    n_layers, dim, n_heads, n_kv_heads, head_dim, inter_dim, vocab_size : int
    """

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    inter_dim: int
    vocab_size: int

    def __post_init__(self):
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "inter_dim", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: {self.n_kv_heads} does not divide n_heads {self.n_heads}")


QWEN3_8B = DenseConfig(n_layers=36, dim=4096, n_heads=32, n_kv_heads=8, head_dim=128, inter_dim=12288,
                       vocab_size=151936)
DENSE_TINY = DenseConfig(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, inter_dim=128, vocab_size=256)


@dataclass(frozen=True)
class Link:
    """The modelled interconnect: per-GPU bandwidth in one direction and a latency per collective.

    Defaults: NVLink 4 on an H200 (450 GB/s each way per GPU, the datasheet's 900 GB/s
    bidirectional) and 10 us per collective (NCCL's small-message latency inside one node).
    Labels, not measurements.
    """

    bandwidth: float = 450e9
    latency_us: float = 10.0

    def allreduce_us(self, nbytes: float, gpus: int) -> float:
        """Ring all-reduce of ``nbytes`` over ``gpus`` GPUs: latency + 2 (n - 1) / n bytes / bandwidth."""
        return 0.0 if gpus == 1 else self.latency_us + 2 * (gpus - 1) / gpus * nbytes / self.bandwidth * 1e6

    def alltoall_us(self, nbytes: float, gpus: int) -> float:
        """All-to-all in which each GPU sends ``nbytes`` in total: latency + bytes / bandwidth."""
        return 0.0 if gpus == 1 else self.latency_us + nbytes / self.bandwidth * 1e6


def comm_per_layer_us(tokens: int, dim: int, gpus: int, link: Link, comm: str = "allreduce", *,
                      moe: bool = True, k: int = 8) -> float:
    """Modelled communication of one layer on one GPU for ``tokens`` tokens of width ``dim`` (bf16).

    ``allreduce``: two all-reduces of tokens x dim (after attention, after the FFN).
    ``alltoall`` (MoE layers): the attention all-reduce as a reduce-scatter and all-gather
    around the MoE, plus dispatch and combine all-to-alls of each GPU's tokens / gpus tokens'
    k slots, the (n - 1) / n that go to other GPUs. Dense layers always take two all-reduces.
    """
    if comm not in ("allreduce", "alltoall"):
        raise ValueError(f"comm: expected 'allreduce' or 'alltoall', got {comm!r}")
    act = tokens * dim * 2
    if comm == "allreduce" or not moe:
        return 2 * link.allreduce_us(act, gpus)
    slots = tokens / gpus * k * (gpus - 1) / gpus * dim * 2
    return link.allreduce_us(act, gpus) + link.latency_us * (gpus > 1) + 2 * link.alltoall_us(slots, gpus)


class DenseAttention(nn.Module):
    """GQA attention of a dense model over a KV cache: fused QKV projection, SDPA, output projection.

    The tree's own K/V rows are written at ``prefix .. prefix + N - 1``; every query attends to
    the whole prefix and all tree rows (the tree mask, at most N of P + N columns, is left out;
    rotary embedding and QK-norm, elementwise, too). The ``heads / kv_heads`` query heads of a
    group are folded into the query length, so SDPA runs plain multi-head attention.
    """

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.cfg = cfg
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, k_cache, v_cache, prefix: int):
        """x [B, N, dim]; k_cache, v_cache [B, kv_heads, S, head_dim] with S >= prefix + N."""
        c = self.cfg
        B, N, _ = x.shape
        g, hd = c.n_heads // c.n_kv_heads, c.head_dim
        q, k, v = self.wqkv(x).split([c.n_heads * hd, c.n_kv_heads * hd, c.n_kv_heads * hd], dim=-1)
        k_cache[:, :, prefix:prefix + N] = k.view(B, N, c.n_kv_heads, hd).transpose(1, 2)
        v_cache[:, :, prefix:prefix + N] = v.view(B, N, c.n_kv_heads, hd).transpose(1, 2)
        q = q.view(B, N, c.n_kv_heads, g, hd).permute(0, 2, 3, 1, 4).reshape(B, c.n_kv_heads, g * N, hd)
        o = torch.nn.functional.scaled_dot_product_attention(q, k_cache[:, :, :prefix + N],
                                                             v_cache[:, :, :prefix + N])
        o = o.view(B, c.n_kv_heads, g, N, hd).permute(0, 3, 1, 2, 4).reshape(B, N, c.n_heads * hd)
        return self.wo(o)


DENSE_MODELS = {"qwen3_8b": QWEN3_8B, "dense_tiny": DENSE_TINY}


def step_config(model: str) -> ModelConfig | DenseConfig:
    """The shapes behind a step model's name: a dense model of ``DENSE_MODELS`` or an engine preset."""
    return DENSE_MODELS[model] if model in DENSE_MODELS else get_config(model)


L2_STATES = ("warm", "cold")


# Host seconds per component row of ``measure_components`` on a CPU, spread over the rounds of one
# ``Rounds``: a host burst that covers only part of a measurement leaves every row a quiet round.
HOST_ROUNDS = 20
HOST_ROUNDS_S = 2 * HOST_MIN_S


def _timer(quick: bool, l2: str = "warm", rounds: Rounds | None = None):
    """Graph replay on a GPU, the host clock on CPU; returns fn -> Timing (on CPU registered in
    ``rounds`` where given, taken by its ``run``).

    ``l2="warm"`` (the model's default): calls replayed back to back (2 or 5 per replay), the
    replay's launch latency shared among them. ``"cold"``: one call per replay, the L2 flushed
    before each (the flush keeps the device busy while the host launches the replay, so the
    launch latency is not timed), as if a step's other layers had evicted every weight. Against
    the engine's two-layer steps on an H200 (``validate``, 6 presets x 8 budgets) the warm sum
    came within 0.91-1.10 of the measured step and the cold one within 0.88-1.15, 2-8% higher:
    cold flushing costs a component more than the preceding components of a real step do.
    """
    if l2 not in L2_STATES:
        raise ValueError(f"l2: expected one of {L2_STATES}, got {l2!r}")
    if torch.cuda.is_available():
        if l2 == "cold":
            return lambda fn: time_graph(fn, reps=5 if quick else 20, calls_per_graph=1, warmup=1, l2="cold")
        return lambda fn: time_graph(fn, reps=5 if quick else 20, calls_per_graph=2 if quick else 5, warmup=1)
    if rounds is not None:
        return lambda fn: rounds.host(fn, reps=2 if quick else 5, warmup=1, min_s=HOST_ROUNDS_S)
    return lambda fn: time_host(fn, reps=2 if quick else 5, warmup=1)


def _host_rounds() -> Rounds | None:
    """The rounds a measurement's host timings are registered in (None on a GPU: replayed at once)."""
    return None if torch.cuda.is_available() else Rounds(HOST_ROUNDS)


def _taken(rows: list[dict], rounds: Rounds | None) -> list[dict]:
    """Rows whose ``_timing`` (a :class:`Timing`, its times divided by ``_per_layers`` where given)
    becomes their timing columns, once ``rounds`` (if any) has taken them."""
    if rounds is not None:
        rounds.run()
    out = []
    for r in rows:
        r = dict(r)
        t, div = r.pop("_timing"), r.pop("_per_layers", 1)
        out.append({**r, **{k: v / div if k.endswith("_us") else v for k, v in t.as_dict().items()}})
    return out


def _init(make: Callable[[], nn.Module], device, dtype, seed: int) -> nn.Module:
    """The module ``make()`` builds, on ``device`` in ``dtype`` with N(0, 1 / fan_in) weights
    (embeddings N(0, 1), norms 1), eval, no grad. ``make`` runs on the meta device, so torch's
    default initialisation never runs: on the host it cost 9 s for Kimi K2's embedding and head
    (2 x 1.2 G float32 draws) in every 05 notebook, weights then overwritten here."""
    with torch.device("meta"):
        module = make()
    module = module.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:       # norm weights
                p.fill_(1.0)
            else:
                p.normal_(0.0, 1.0 if isinstance(module, nn.Embedding) else p.shape[-1] ** -0.5, generator=gen)
    return module.eval().requires_grad_(False)


def nodes_for(budget) -> int:
    """Tree tokens per sequence: 1 for greedy decoding (``budget=0``), 16 for the chain
    (``"chain"``, 15 draft positions), ``budget + 1`` otherwise."""
    return 1 if budget == 0 else (16 if budget == "chain" else int(budget) + 1)


def _probe(vocab: int, cpu: bool) -> ModelConfig:
    """A two-layer target with the kernels' attention shapes (8 heads, latent 576) and small
    widths, at ``vocab``: the engine model whose decode phases (drafter, top-K, build, accept,
    compact, commit) are timed; only its vocabulary and the batch shape them."""
    base = get_config("tiny") if cpu else replace(get_config("kimi_k2_tp8"), dim=256, q_lora_rank=64,
                                                   inter_dim=256, moe_inter_dim=64)
    return replace(base, n_layers=2, vocab_size=vocab)


def measure_decode_phases(vocab: int, batches, budgets, *, drafter: str = "small", quick: bool = True,
                          seed: int = 0, l2: str = "warm") -> list[dict]:
    """Time the engine's per-step phases besides the verify forward, per (batch, budget).

    Runs ``kdtree.engine.ddtree.start`` on a two-layer probe model (``_probe``) with the
    synthetic drafter ``drafter`` over ``vocab``, then times each phase (draft, topk, build,
    accept, compact, commit; greedy decoding: commit) alone. ``budget`` 0 is greedy decoding,
    ``"chain"`` the single chain (top-1, 15 deep). Compaction is timed over the probe's 2
    layers and reported per layer (``per="layer"``): its work grows with the layers. ``l2``:
    as for ``measure_components``; on a CPU the phases are taken in rounds, as there.
    """
    rounds = _host_rounds()
    return _taken(_phase_timings(vocab, batches, budgets, drafter, quick, seed, _timer(quick, l2, rounds)), rounds)


def _phase_timings(vocab, batches, budgets, drafter, quick, seed, timer) -> list[dict]:
    """``measure_decode_phases``' rows, each with its ``timer`` timing (``_taken`` fills them in).

    Each (batch, budget) has its own decode state, so a phase timed in rounds between other
    phases sees the state its own earlier calls left: a repeated commit stops advancing once
    the state has emitted its tokens, as it did timed alone."""
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cfg = _probe(vocab, not cuda)
    model = build_model(cfg, seed=seed, device=device, dtype=dtype)
    dcfg = get_drafter_config(drafter)
    rows = []
    for B in batches:
        gen = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(0, vocab, (8,), generator=gen).to(device) for _ in range(B)]
        d = SyntheticDrafter(dcfg, vocab, seed=seed, device=device, dtype=dtype)
        d.set_reference(torch.randint(0, vocab, (B, 64), generator=gen).to(device))
        for budget in budgets:
            mode = "ar" if budget == 0 else "ddtree"
            b, topk = (dcfg.draft_len, 1) if budget == "chain" else (max(int(budget), 1), None)
            state, phases = start(model, prompts, 16, mode, d if mode == "ddtree" else None, b, topk)
            run_phases(phases)
            rest = [(name, fn) for name, fn in phases if name != "verify"]
            for name, fn in rest:
                if cuda:
                    run_phases(rest)  # fresh eager inputs for this phase, not a released capture's
                per_layer = name == "compact"
                rows.append(dict(component=name, per="layer" if per_layer else "step", batch=B,
                                 nodes=nodes_for(budget), prefix=0, tokens=B * nodes_for(budget),
                                 budget_label=str(budget), _timing=timer(fn),
                                 _per_layers=cfg.n_layers if per_layer else 1))
    return rows


def _row(component, per, B, N, P, t: Timing, budget=""):
    return dict(component=component, per=per, batch=B, nodes=N, prefix=P, tokens=B * N, budget_label=str(budget),
                _timing=t)


def measure_components(model: str, batches, budgets, prefixes, *, drafter: str = "small", quick: bool = True,
                       seed: int = 0, phases: list[dict] | None = None, target: nn.Module | None = None,
                       core: bool = True, l2: str = "warm") -> pd.DataFrame:
    """Measure every component of a step of ``model`` at each (batch, budget, prefix).

    Parameters
    ----------
    model : str
        An engine preset (an MLA + MoE target, e.g. ``kimi_k2_ep8``; its MoE layers must exist)
        or ``"qwen3_8b"`` (``QWEN3_8B``) / ``"dense_tiny"`` (``DENSE_TINY``, CPU tests).
    batches, prefixes : iterables of int
    budgets : iterable
        Tree budgets; 0 (greedy decoding) and ``"chain"`` are always added.
    drafter : str
        Drafter preset of the decode phases.
    quick : bool
        Fewer repetitions.
    phases : list of dict, optional
        Rows of ``measure_decode_phases`` at this model's vocabulary, batches and budgets,
        measured once for several models that share them (they depend on nothing else),
        or the engine's own phases (``validate``); measured here when not given.
    target : Transformer, optional
        A built engine model of preset ``model`` (with at least ``first_dense + 1`` layers)
        whose layers are timed (its first dense FFN, its first MoE layer's attention and MoE,
        its final norm, embedding and LM head) instead of a freshly built probe.
    core : bool
        Also time ``verify_attention`` alone (``attention_core``, info only) on a GPU.
    l2 : {"warm", "cold"}
        How each component is replayed on a GPU (``_timer``): ``warm`` (the model), back to
        back; ``cold``, each call after an L2 flush.

    Returns
    -------
    DataFrame
        Tidy rows: model, component, per (``layer``: once per layer of its kind; ``step``:
        once per step; ``info``: not summed), batch, nodes, prefix, tokens, budget_label (the
        decode phases' run: ``0`` greedy, ``chain`` or the budget; empty elsewhere), median_us,
        p20_us, p80_us, reps, mode, l2. Components: ``attention`` (per layer, at every prefix),
        ``attention_core`` (info: ``verify_attention`` alone), ``moe`` / ``dense_ffn`` (per
        layer of that kind), ``ffn`` (dense models), ``norms``, ``embed_head``, and the decode
        phases of ``measure_decode_phases``. On a CPU every row is timed in rounds spread
        over the whole measurement (``Rounds``, :data:`HOST_ROUNDS` rounds of every row in
        turn), and is its quietest round. Interference on a shared host comes in bursts of
        seconds that slow every repetition they cover (1.3-1.9x, 11 and 12 of 148 component
        rows of two CPU runs timed row by row); a burst over part of the measurement leaves
        each row rounds outside it, and one over all of it moves every row together.
    """
    if l2 not in L2_STATES:
        raise ValueError(f"l2: expected one of {L2_STATES}, got {l2!r}")
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    rounds = _host_rounds()
    timer = _timer(quick, l2, rounds)
    budgets = [0, "chain"] + [b for b in budgets if b not in (0, "chain")]
    batches, prefixes = [int(b) for b in batches], [int(p) for p in prefixes]
    dense = model in DENSE_MODELS
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    if dense:
        cfg = DENSE_MODELS[model]
        attn = _init(lambda: DenseAttention(cfg), device, dtype, seed)
        ffn = _init(lambda: SwiGLU(cfg.dim, cfg.inter_dim), device, dtype, seed + 1)
        vocab = cfg.vocab_size
    else:
        cfg = get_config(model)
        if cfg.n_layers <= cfg.first_dense:
            raise ValueError(f"model: preset {model!r} has no MoE layer")
        if target is not None and (len(target.layers) <= cfg.first_dense or target.cfg.dim != cfg.dim):
            raise ValueError(f"target: expected a model of preset {model!r} with an MoE layer")
        probe = target if target is not None else build_model(
            replace(cfg, n_layers=cfg.first_dense + 1, vocab_size=256), seed=seed, device=device, dtype=dtype)
        first = probe.layers[cfg.first_dense]
        attn, moe, ffn = first.attn, first.ffn, probe.layers[0].ffn
        vocab = cfg.vocab_size
    if target is not None and not dense:
        norm, embed, head = target.norm, target.embed, target.head
    else:
        norm = _init(lambda: RMSNorm(cfg.dim, 1e-6), device, dtype, seed)
        embed = _init(lambda: nn.Embedding(vocab, cfg.dim), device, dtype, seed + 2)
        head = _init(lambda: nn.Linear(cfg.dim, vocab, bias=False), device, dtype, seed + 3)
    for B in batches:
        for N in sorted({nodes_for(b) for b in budgets}):
            x = torch.randn(B, N, cfg.dim, device=device, generator=gen).to(dtype)
            tok = torch.randint(0, vocab, (B, N), device=device, generator=gen)
            rows.append(_row("norms", "layer", B, N, 0, timer(lambda x=x: (norm(x) + x, norm(x) + x))))
            rows.append(_row("embed_head", "step", B, N, 0,
                             timer(lambda x=x, tok=tok: (embed(tok), head(norm(x)).argmax(-1)))))
            if dense:
                rows.append(_row("ffn", "layer", B, N, 0, timer(lambda x=x: ffn(x))))
            else:
                rows.append(_row("moe", "layer", B, N, 0, timer(lambda x=x: moe(x))))
                rows.append(_row("dense_ffn", "layer", B, N, 0, timer(lambda x=x: ffn(x))))
            for P in prefixes:
                rows += _attention_rows(dense, cfg, attn, x, B, N, P, device, dtype, timer, gen, core)
    if phases is None:
        rows += _phase_timings(vocab, batches, budgets, drafter, quick, seed, timer)
    rows = _taken(rows, rounds) + [dict(r) for r in (phases or [])]
    df = pd.DataFrame(rows)
    df.insert(0, "model", model)
    if cuda:
        torch.cuda.empty_cache()
    return df


def _attention_rows(dense, cfg, attn, x, B, N, P, device, dtype, timer, gen, core=True) -> list[dict]:
    """Attention at (B, N, P): the whole attention block, and for MLA the verify kernel alone."""
    if dense:
        kc = torch.zeros(B, cfg.n_kv_heads, P + N, cfg.head_dim, device=device, dtype=dtype)
        vc = torch.zeros_like(kc)
        return [_row("attention", "layer", B, N, P, timer(lambda: attn(x, kc, vc, P)))]
    kv = torch.randn(B, P + N, cfg.latent_dim, device=device, generator=gen).to(dtype)
    lens = torch.full((B,), P, device=device, dtype=torch.int64)
    tree = chain_tree(torch.full((B,), N, device=device), N)
    pos = lens[:, None] + tree.depth.clamp_min(0)
    rows = [_row("attention", "layer", B, N, P, timer(lambda: attn(x, pos, kv, lens, tree)))]
    if core and torch.cuda.is_available():
        q = torch.randn(B, N, cfg.n_heads, cfg.latent_dim, device=device, generator=gen).to(dtype)
        rows.append(_row("attention_core", "info", B, N, P, timer(
            lambda: verify_attention(q, kv, lens, tree, cfg.softmax_scale, check_values=False))))
    return rows


def predict(components: pd.DataFrame, *, layers: int, first_dense: int, batch: int, budget, prefix: int,
            gpus: int = 1, link: Link | None = None, comm: str = "allreduce", dim: int | None = None,
            k: int = 8) -> dict[str, float]:
    """Predicted step time on one GPU, by component, in microseconds.

    Parameters
    ----------
    components : DataFrame
        ``measure_components``' table for one model.
    layers, first_dense : int
        Layer count and how many of them are dense (MoE models); a dense model's table has an
        ``ffn`` component and every layer takes it.
    batch, budget, prefix
        The step: ``budget`` 0 (greedy), ``"chain"`` or a tree budget.
    gpus, link, comm, dim, k
        The modelled communication (``comm_per_layer_us``); ``gpus=1`` has none. ``dim`` is
        the hidden width (needed when gpus > 1).

    Returns
    -------
    dict
        Component -> microseconds (attention, moe, dense_ffn or ffn, norms, comm, embed_head
        and the decode phases); ``step`` is their sum.
    """
    if not isinstance(layers, int) or layers < 1 or not 0 <= first_dense <= layers:
        raise ValueError(f"layers, first_dense: expected 1 <= layers and 0 <= first_dense <= layers, "
                         f"got {layers}, {first_dense}")
    N = nodes_for(budget)
    c = components[(components.batch == batch) & (components.nodes == N)]
    if c.empty:
        raise ValueError(f"components: nothing measured at batch={batch}, nodes={N}")

    def get(name, **where):
        r = c[c.component == name]
        for col, v in where.items():
            r = r[r[col] == v]
        if r.empty:
            raise ValueError(f"components: no {name!r} at batch={batch}, nodes={N}, {where}")
        return float(r.median_us.iloc[0])

    out = {"attention": layers * get("attention", prefix=prefix), "norms": layers * get("norms")}
    if "ffn" in set(c.component):
        out["ffn"] = layers * get("ffn")
    else:
        out["moe"] = (layers - first_dense) * get("moe")
        out["dense_ffn"] = first_dense * get("dense_ffn")
    if gpus > 1:
        if dim is None:
            raise ValueError("dim: needed for the communication when gpus > 1")
        link = link or Link()
        out["comm"] = (first_dense * comm_per_layer_us(batch * N, dim, gpus, link, comm, moe=False, k=k)
                       + (layers - first_dense) * comm_per_layer_us(batch * N, dim, gpus, link, comm,
                                                                     moe="ffn" not in out, k=k))
    out["embed_head"] = get("embed_head")
    phases = c[(c.per.isin(["step", "layer"])) & (c.budget_label == str(budget))
               & ~c.component.isin(["attention", "norms", "moe", "dense_ffn", "ffn", "embed_head"])]
    for name, per, us in zip(phases.component, phases.per, phases.median_us):
        out[name] = float(us) * (layers if per == "layer" else 1)
    out["step"] = sum(out.values())
    return out


def engine_tau(throughput: pd.DataFrame, mode: str = "graph") -> tuple[dict, float]:
    """The engine's measured acceptance from ``engine_tables``' throughput table: {budget: tau}
    for DDTree and the chain's tau, from the rows of timing ``mode`` (first accuracy)."""
    t = throughput[throughput["mode"] == mode] if "mode" in throughput else throughput
    if "accuracy" in t:
        t = t[t.accuracy == t.accuracy.iloc[0]]
    tree = t[t.decode == "ddtree"]
    chain = t[t.decode == "chain"]
    if tree.empty or chain.empty:
        raise ValueError("throughput: needs ddtree and chain rows (engine_tables' throughput table)")
    return {int(b): float(v) for b, v in zip(tree.budget, tree.tau)}, float(chain.tau.iloc[0])


def speedup_table(components: pd.DataFrame, *, layers: int, first_dense: int, batches, prefixes,
                  tau: dict | None = None, tau_chain: float | None = None, gpus: int = 1,
                  link: Link | None = None, comm: str = "allreduce", dim: int | None = None,
                  k: int = 8, label: str = "") -> pd.DataFrame:
    """Predicted step time and DDTree's speedup over greedy decoding against budget.

    ``tau`` (budget -> acceptance length) defaults to ``PAPER_TAU`` and ``tau_chain`` to
    ``PAPER_TAU_CHAIN``. One row per (batch, prefix, decode, budget): the components' timing
    mode and L2 state (``mode``, ``l2``), step_us (predicted),
    greedy_us, tau, tokens_per_s (per sequence), speedup, best (the best budget of its
    (batch, prefix)), and the components (``c_*`` columns, microseconds).
    """
    tau = PAPER_TAU if tau is None else tau
    tau_chain = PAPER_TAU_CHAIN if tau_chain is None else tau_chain
    kw = dict(layers=layers, first_dense=first_dense, gpus=gpus, link=link, comm=comm, dim=dim, k=k)
    mode, l2 = ("+".join(sorted(components[c].astype(str).unique())) for c in ("mode", "l2"))
    rows = []
    for B in batches:
        for P in prefixes:
            greedy = predict(components, batch=B, budget=0, prefix=P, **kw)
            runs = [("greedy", 0, 1.0), ("chain", "chain", tau_chain)] + [("ddtree", b, t) for b, t in tau.items()]
            part = []
            for decode, budget, t in runs:
                p = predict(components, batch=B, budget=budget, prefix=P, **kw)
                part.append(dict(model=label, gpus=gpus, batch=B, prefix=P, decode=decode, mode=mode, l2=l2,
                                 budget=15 if budget == "chain" else int(budget), tau=t, step_us=p["step"],
                                 greedy_us=greedy["step"], tokens_per_s=t / p["step"] * 1e6,
                                 speedup=t * greedy["step"] / p["step"],
                                 **{f"c_{n}": v for n, v in p.items() if n != "step"}))
            best = max((r for r in part if r["decode"] == "ddtree"), key=lambda r: r["speedup"])
            for r in part:
                r["best"] = r is best
            rows += part
    return pd.DataFrame(rows)


class _MoEInputs:
    """Forward pre-hooks that keep the input of each MoE layer's ``call``-th forward (0-based).

    ``step_breakdown`` prefills (forward 0) and runs two warm-up steps (forwards 1 and 2)
    before it times anything: with ``call=2`` the hooks keep the activations each router sees
    in the verify forward of the second step, tree tokens included, without running the
    engine again. Later forwards (the captures and their replays) are ignored.
    """

    def __init__(self, moes: list[MoE], call: int = 2):
        self.seen: list[torch.Tensor | None] = [None] * len(moes)
        self.count = [0] * len(moes)
        self.call = call
        self.hooks = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(moes)]

    def _hook(self, i: int):
        def hook(module, args):
            if self.count[i] == self.call:
                self.seen[i] = args[0].detach().clone()
            self.count[i] += 1
        return hook

    def remove(self) -> list[torch.Tensor]:
        """Remove the hooks; the kept inputs, one per MoE layer."""
        for h in self.hooks:
            h.remove()
        if any(x is None for x in self.seen):
            raise RuntimeError(f"MoE inputs: forward {self.call} not seen ({self.count} forwards per layer)")
        return list(self.seen)


def _distinct(moe: MoE, x: torch.Tensor) -> int:
    """Local experts the router picks for the tokens of x [..., dim]."""
    expert = moe.route(x.reshape(-1, x.shape[-1]))[1]
    return int(expert[expert < moe.w1.shape[0]].unique().numel())


_PHASES = ("draft", "topk", "build", "accept", "compact", "commit")


def _phase_rows(rows: list[dict], batch: int, budget, layers: int) -> list[dict]:
    """``step_breakdown``'s decode phases (each timed alone) as component rows of ``measure_components``
    (compaction per layer, as ``measure_decode_phases`` gives it)."""
    out = []
    for r in rows:
        if r["phase"] not in _PHASES:
            continue
        per = "layer" if r["phase"] == "compact" else "step"
        div = layers if per == "layer" else 1
        out.append(dict(component=r["phase"], per=per, batch=batch, nodes=nodes_for(budget), prefix=0,
                        tokens=batch * nodes_for(budget), budget_label=str(budget),
                        median_us=r["median_us"] / div, p20_us=r["p20_us"] / div, p80_us=r["p80_us"] / div,
                        reps=r["steps"], mode=r["timing"] if r["timing"] == "graph" else "host",
                        l2="warm"))
    return out


def validate(preset: str, *, layers: int, batch: int = 1, budgets=(16, 64), prompt: int = 512, new: int = 64,
             steps: int = 10, drafter: str = "small", quick: bool = True, seed: int = 0) -> pd.DataFrame:
    """The step model against the engine's measured step at ``preset`` with ``layers`` layers.

    One model per preset (random weights, the synthetic drafter; acceptance does not change a
    step's time, the shapes being static), reused for every budget. Per budget (0: greedy
    decoding) ``step_breakdown`` runs the engine: the MEASURED step is the whole step in one
    graph (eager on CPU), and the decode phases (draft, top-K, build, accept, compact,
    commit), each timed alone in its own graph, are components of the prediction. The other
    components come from ``measure_components`` at the same batch and budgets with the prefix
    at mid-run (``prompt + new / 2``), timed alone on this model's own layers (its first
    dense FFN, its first MoE layer's attention and MoE, its norm, embedding and LM head); the
    prediction is their sum by ``predict`` for ``layers`` layers on one GPU.

    The MoE's time depends on how many experts its tokens touch, which depends on the data:
    ``measure_components`` routes random activations, while the engine routes its own hidden
    states, whose tree tokens (random weights, a synthetic drafter that reuses candidates
    across depths) can share experts far more. So the MoE term is given both ways: measured
    on each MoE layer's own inputs in one of the engine's verify forwards (``_MoEInputs``;
    ``predicted_us``, ``ratio``) and as the components' random routing
    (``predicted_random_us``, ``ratio_random``), with the mean distinct local experts per
    layer of each (``distinct_engine``, ``distinct_random``). One row per budget, with the
    prediction's components (``c_*``, engine routing) and ``status`` ("ok").

    The components are replayed warm, as the model times them (``measure_components``);
    ``predicted_cold_us`` / ``ratio_cold`` sum the same components each timed after an L2 flush
    (on a CPU the two are the same host timings). Where a miss comes from: ``measured_verify_us``,
    the engine's verify forward alone (its own graph), against ``predicted_verify_us``, the
    forward's components (attention, norms, MoE, dense FFN, embedding and head); the measured
    step's spread is ``measured_p20_us`` .. ``measured_p80_us`` over its ``steps`` replays.
    """
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cfg = replace(get_config(preset), n_layers=layers)
    if cfg.n_layers <= cfg.first_dense:
        raise ValueError(f"layers: {layers} leaves preset {preset!r} without an MoE layer "
                         f"(first_dense={cfg.first_dense})")
    model = build_model(cfg, seed=seed, device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (prompt,), generator=gen).to(device) for _ in range(batch)]
    dcfg = get_drafter_config(drafter)
    d = SyntheticDrafter(dcfg, cfg.vocab_size, seed=seed, device=device, dtype=dtype)
    d.set_reference(torch.randint(0, cfg.vocab_size, (batch, new + dcfg.draft_len + 2), generator=gen).to(device))
    timing = "graph" if cuda else "eager"
    timers = {l2: _timer(quick, l2) for l2 in L2_STATES}
    moes = [b.ffn for b in model.layers if isinstance(b.ffn, MoE)]
    measured, engine_moe, phases = {}, {}, []
    for budget in [0, *budgets]:
        mode = "ar" if budget == 0 else "ddtree"
        hooks = _MoEInputs(moes)
        try:
            rows = step_breakdown(model, prompts, mode=mode, drafter=d if budget else None, budget=max(budget, 1),
                                  steps=steps, warmup=2, timing=timing, max_new_tokens=new)
        finally:
            xs = hooks.remove()
        by = {r["phase"]: r for r in rows}
        measured[budget] = (by["step"]["median_us"], by["step"]["p20_us"], by["step"]["p80_us"],
                            by["verify"]["median_us"])
        phases += _phase_rows(rows, batch, budget, layers)
        rand = torch.randn(xs[0].shape, generator=gen).to(device, dtype)
        engine_moe[budget] = ({l2: sum(t(lambda m=m, x=x: m(x)).median_us for m, x in zip(moes, xs))
                               for l2, t in timers.items()} if cuda else
                              dict.fromkeys(L2_STATES, sum(timers["warm"](lambda m=m, x=x: m(x)).median_us
                                                           for m, x in zip(moes, xs))),
                              sum(_distinct(m, x) for m, x in zip(moes, xs)) / len(moes),
                              sum(_distinct(m, rand) for m in moes) / len(moes))
    P = prompt + new // 2
    comps = {l2: measure_components(preset, [batch], list(budgets), [P], drafter=drafter, quick=quick, seed=seed,
                                    phases=phases, target=model, core=False, l2=l2)
             for l2 in (L2_STATES if cuda else ("warm",))}
    comps.setdefault("cold", comps["warm"])
    out = []
    for budget, (meas, p20, p80, verify) in measured.items():
        moe_us, distinct_engine, distinct_random = engine_moe[budget]
        pred = {}
        for l2 in L2_STATES:
            p = predict(comps[l2], layers=layers, first_dense=cfg.first_dense, batch=batch, budget=budget, prefix=P)
            random_step, p["moe"] = p.pop("step"), moe_us[l2]
            p["step"] = sum(p.values())
            pred[l2] = p, random_step
        (p, random_step), cold = pred["warm"], pred["cold"][0]["step"]
        forward = sum(p[n] for n in ("attention", "norms", "moe", "dense_ffn", "embed_head"))
        out.append(dict(preset=preset, layers=layers, batch=batch, budget=budget, prefix=P, measured_us=meas,
                        measured_p20_us=p20, measured_p80_us=p80, predicted_us=p["step"], ratio=p["step"] / meas,
                        predicted_cold_us=cold, ratio_cold=cold / meas, measured_verify_us=verify,
                        predicted_verify_us=forward, predicted_random_us=random_step,
                        ratio_random=random_step / meas, distinct_engine=distinct_engine,
                        distinct_random=distinct_random, timing=timing, status="ok",
                        **{f"c_{n}": v for n, v in p.items() if n != "step"}))
    model = moes = None
    if cuda:
        torch.cuda.empty_cache()
    return pd.DataFrame(out)


def fitting_presets(memory_bytes: float = 139 * 2**30) -> list[str]:
    """The engine presets of Kimi K2's shapes whose full preset fits one GPU of ``memory_bytes``
    (``fitting_layers``), in ``MODEL_PRESETS`` order; the CPU presets (``tiny*``) left out."""
    return [name for name, cfg in MODEL_PRESETS.items()
            if not name.startswith("tiny") and fitting_layers(cfg, memory_bytes) >= cfg.n_layers]


def validate_presets(presets, *, layers: int, batch: int = 1, budgets=BUDGETS, prompt: int = 512, new: int = 64,
                     steps: int = 10, drafter: str = "small", quick: bool = True, seed: int = 0,
                     memory_bytes: float | None = None, log=None) -> pd.DataFrame:
    """``validate`` at each preset of ``presets`` with ``layers`` layers (the preset's first dense
    layers included), one table; ``within`` flags a prediction within 15% of the measured step.

    A preset whose ``layers`` layers do not fit one GPU of ``memory_bytes`` (default: this
    GPU's memory on CUDA; no limit on CPU; ``fitting_layers``), or that runs out of memory, is
    not validated: its rows (one per budget) say so in ``status`` with NaN times, and
    ``within`` is False there. ``seconds``: the wall time of the preset's validation (what it
    costs the notebook, not a measurement of the model). ``log``: called with a line per
    preset (e.g. ``print``), if given.
    """
    if not presets:
        raise ValueError("presets: expected at least one preset")
    if memory_bytes is None and torch.cuda.is_available():
        memory_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    parts = []
    for p in presets:
        cfg = replace(get_config(p), n_layers=layers)
        why, t0 = "", time.perf_counter()
        if memory_bytes is not None and fitting_layers(cfg, memory_bytes) < layers:
            why = f"does not fit one GPU: {layers} layers over {memory_bytes / 2**30:.0f} GiB"
        else:
            try:
                parts.append(validate(p, layers=layers, batch=batch, budgets=budgets, prompt=prompt, new=new,
                                      steps=steps, drafter=drafter, quick=quick, seed=seed))
            except torch.cuda.OutOfMemoryError as exc:
                why = f"out of memory: {str(exc).splitlines()[0][:200]}"
                torch.cuda.empty_cache()
        if why:
            parts.append(pd.DataFrame([dict(preset=p, layers=layers, batch=batch, budget=b, measured_us=float("nan"),
                                            predicted_us=float("nan"), ratio=float("nan"), status=why)
                                       for b in [0, *budgets]]))
        parts[-1]["seconds"] = time.perf_counter() - t0
        if log is not None:
            log(f"{p}: {why or 'validated'} in {parts[-1]['seconds'].iloc[0]:.1f} s")
    out = pd.concat(parts, ignore_index=True)
    out["within"] = (out.ratio - 1).abs() <= 0.15
    return out


def best_budgets(table: pd.DataFrame) -> pd.DataFrame:
    """The best budget per (model, gpus, batch, prefix) of ``speedup_table`` rows, with its speedup."""
    best = table[table.best.astype(bool)]
    return best[["model", "gpus", "batch", "prefix", "budget", "tau", "speedup", "step_us", "greedy_us"]] \
        .reset_index(drop=True)


def best_budget_statement(table: pd.DataFrame, batches=None) -> list[str]:
    """The best budget of each model at ``batches`` (default: the table's smallest and largest
    batch), one sentence per prefix, from ``speedup_table`` rows (a run's ``speedup`` table):
    the budget with the highest predicted speedup over greedy decoding, and that speedup."""
    best = best_budgets(table)
    have = sorted(int(b) for b in best.batch.unique())
    batches = [have[0], have[-1]] if batches is None else [int(b) for b in batches]
    if not have or any(b not in have for b in batches):
        raise ValueError(f"batches: expected among the table's batches {have}, got {batches}")
    lines = []
    for prefix, part in best.groupby("prefix", sort=True):
        models = []
        for model, m in part.groupby("model", sort=False):
            gpus = int(m.gpus.iloc[0])
            per = [f"{int(r.budget)} at batch {int(r.batch)} ({r.speedup:.2f}x greedy, tau {r.tau:g})"
                   for r in m.set_index(m.batch.astype(int)).loc[sorted(set(batches))].itertuples()]
            models.append(f"{model} on {gpus} GPU{'s' if gpus > 1 else ''}: best budget " + ", ".join(per))
        lines.append(f"Prefix {int(prefix)}: " + "; ".join(models) + ".")
    return lines


"""The cost model of kdtree's kernels: one per kernel and variant, used by every benchmark.

A call of a kernel variant is a sequence of launches (:class:`Launch`). Each launch carries the
FLOPs it executes (padding rows of tensor tiles and masked tiles included) and the bytes it
moves at two levels of the memory system, as the code moves them:

- ``l2_read`` / ``l2_write``: L2 <-> SM traffic, every load and store that reaches the L2
  (a per-head re-read counts each time; split partials count when written and when read);
- ``dram_read`` / ``dram_write``: HBM traffic of the launch started on a flushed L2 (what
  Nsight Compute measures with ``--cache-control all``): each input byte once (the L2 catches
  re-reads), and written bytes only where they cannot stay in the L2.

:class:`Cost` sums them over a call and adds the useful FLOPs and the algorithmic minimum of
bytes (every input read once, every output written once). ``hbm_bytes`` is the cold call's
HBM traffic as one sequence of launches: an intermediate that one launch writes and the next
reads (split partials) stays in the L2 when it fits. The roofline (``kdtree.bench.roofline``)
and the counter check (``kdtree.bench.counters``) read the same figures, under the column
names of :data:`COLUMNS`.

Verify attention (MLA absorb): per (query row x head x visible token) the scores take 2 * 576
FLOPs and the value product 2 * 512, so 2 * (576 + 512) = 2176; a KV row is 576 bf16 values
(1152 bytes) shared by all heads. The CUDA variants follow ``kdtree.attention.launch_plan``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KV_DIM = 576          # latent 512 + rope 64
V_DIM = 512           # output width per head
BF16 = 2
F32 = 4
KV_ROW_BYTES = KV_DIM * BF16
ATTN_FLOPS_PER_TOKEN = 2 * (KV_DIM + V_DIM)
KV_TILE = 64          # KV rows per tile of the fused kernel (FUSED_BN)
SECTOR = 32           # bytes per L2 / DRAM sector
H200_L2_BYTES = 60 << 20
H200_SMS = 132
# Blocks of verify_naive resident on one SM (73 registers x 256 threads: 3 blocks per SM, as
# Nsight Compute reports on an H200). Every block walks the same prefix rows in the same order,
# so co-resident blocks share each row through the SM's L1: one L2 read per row per SM.
NAIVE_RESIDENT = 3
# The L2 of an H100 / H200 is two partitions; each caches what the SMs attached to it read, and
# a line homed in the other partition is held there too. Bytes that SMs of both halves read (a
# KV range every block of a sequence walks) take two copies; bytes one SM reads take one copy,
# or two when homed in the far partition (half of them): 1.5 on average.
SHARED_COPY = 2.0
FAR_COPY = 1.5

# Result-table columns every benchmark writes from a Cost (``Cost.columns``).
COLUMNS = ("flops", "flops_exec", "bytes_min", "dram_read", "dram_write", "dram_bytes", "hbm_bytes",
           "l2_read", "l2_write", "l2_bytes", "launches")


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a call, as the code runs it.

    Attributes
    ----------
    kernel : str
        The CUDA function name (as Nsight Compute reports it), or a label for library ops.
    flops_exec : float
        FLOPs the launch executes on its compute unit (tile padding and masked work included).
    dram_read, dram_write : float
        HBM bytes of the launch started on a flushed L2.
    l2_read, l2_write : float
        L2 -> SM and SM -> L2 bytes.
    carried : float
        Bytes of ``dram_read`` that an earlier launch of the same call wrote (they stay in the
        L2 between launches when they fit).
    count : int
        Launches this entry stands for (library ops that run several kernels).
    l2_shared : float
        Bytes of ``l2_read`` that a block requests while a co-resident block requests the same
        bytes (blocks of one sequence and split walk the same KV tiles in step): the L2 request
        coalescer may serve such reads once, so the L2 slices see between ``l2_read - l2_shared``
        and ``l2_read`` bytes.
    blocks, slots, waves, block_tiles : int
        A tile kernel's schedule (0 for other launches): ``blocks`` blocks, ``slots`` resident at
        a time (one per SM), so ``waves`` waves; the longest block walks ``block_tiles`` KV tiles.
    flops_waves : float
        FLOPs the SMs would execute if every slot of every wave ran the longest block: the time
        of the launch at the tensor rate, whole waves counted (``flops_exec`` for launches
        without a tile schedule).
    """

    kernel: str
    flops_exec: float
    dram_read: float
    dram_write: float
    l2_read: float
    l2_write: float
    carried: float = 0.0
    count: int = 1
    l2_shared: float = 0.0
    blocks: int = 0
    slots: int = 0
    waves: int = 0
    block_tiles: int = 0
    flops_waves: float | None = None


@dataclass(frozen=True)
class Cost:
    """What one call of a kernel variant does: useful FLOPs, minimum bytes, and its launches.

    Attributes
    ----------
    flops : float
        Useful floating-point operations (masked work not counted).
    bytes_min : float
        Algorithmic minimum traffic: each input read once, each output written once.
    compute : str
        ``"tensor"`` (bf16 tensor cores), ``"fp32"`` (CUDA-core FMA) or ``"none"``.
    parts : tuple of Launch
        The launches of one call, in order.
    note : str
        Why the variant moves what it moves; the first clause of the diagnosis.
    l2_capacity : float
        L2 bytes the model assumed (for ``hbm_bytes``); 0 when unknown.
    """

    flops: float
    bytes_min: float
    compute: str
    parts: tuple
    note: str
    l2_capacity: float = float(H200_L2_BYTES)

    def _sum(self, name: str) -> float:
        return float(sum(getattr(p, name) for p in self.parts))

    @property
    def launches(self) -> int:
        """Kernel launches per call (each pays the launch floor)."""
        return int(sum(p.count for p in self.parts))

    @property
    def flops_exec(self) -> float:
        """FLOPs as executed (tensor-tile padding and masked tiles included)."""
        return self._sum("flops_exec")

    @property
    def flops_waves(self) -> float:
        """FLOPs as the tile schedule spends tensor time: every slot of every wave of a tile
        kernel runs its longest block (:class:`Launch`); at least ``flops_exec``."""
        return float(sum(p.flops_exec if p.flops_waves is None else p.flops_waves for p in self.parts))

    @property
    def tile_launch(self) -> Launch | None:
        """The call's longest tile launch (most tensor time with whole waves counted), or None."""
        return max((p for p in self.parts if p.waves), key=lambda p: p.flops_waves, default=None)

    @property
    def schedule(self) -> str:
        """The tile schedule of :attr:`tile_launch` in words ("" for none)."""
        p = self.tile_launch
        if p is None:
            return ""
        return (f"{p.blocks} blocks of up to {p.block_tiles} KV tiles in {p.waves} wave{'s' if p.waves > 1 else ''} "
                f"of {p.slots}")

    @property
    def dram_read(self) -> float:
        """HBM bytes read, each launch on a flushed L2 (what the counters measure)."""
        return self._sum("dram_read")

    @property
    def dram_write(self) -> float:
        """HBM bytes written during the launches (writes that stay in the L2 excluded)."""
        return self._sum("dram_write")

    @property
    def dram_bytes(self) -> float:
        """HBM bytes read and written, each launch on a flushed L2."""
        return self.dram_read + self.dram_write

    @property
    def hbm_bytes(self) -> float:
        """HBM bytes of one cold call: intermediates carried between its launches stay in the
        L2 when the call's footprint fits, otherwise they go through HBM."""
        carried = self._sum("carried")
        if carried and self.dram_bytes > self.l2_capacity:
            return self.dram_bytes
        return self.dram_bytes - carried

    @property
    def l2_read(self) -> float:
        """L2 -> SM bytes."""
        return self._sum("l2_read")

    @property
    def l2_write(self) -> float:
        """SM -> L2 bytes."""
        return self._sum("l2_write")

    @property
    def l2_bytes(self) -> float:
        """L2 <-> SM bytes, both directions."""
        return self.l2_read + self.l2_write

    @property
    def l2_shared(self) -> float:
        """L2 -> SM bytes that co-resident blocks request at the same time (see :class:`Launch`)."""
        return self._sum("l2_shared")

    @property
    def l2_merged(self) -> float:
        """The fewest L2 <-> SM bytes the L2 slices serve: ``l2_bytes`` with every concurrent
        identical read merged by the L2 request coalescer (a lower bound)."""
        return self.l2_bytes - self.l2_shared

    @property
    def bytes_moved(self) -> float:
        """What the variant moves through the L2 (same as ``l2_bytes``)."""
        return self.l2_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per HBM byte of a cold call (0 for kernels that do no arithmetic)."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else 0.0

    @property
    def intensity_l2(self) -> float:
        """FLOPs per L2 <-> SM byte."""
        return self.flops / self.l2_bytes if self.l2_bytes else 0.0

    @property
    def reread(self) -> float:
        """How many times the minimum traffic the variant moves through the L2."""
        return self.l2_bytes / self.bytes_min if self.bytes_min else float("nan")

    def columns(self) -> dict:
        """The model's figures under the result-table names of :data:`COLUMNS`."""
        return {name: float(getattr(self, name)) for name in COLUMNS}


def _positive(**kw) -> None:
    for name, v in kw.items():
        if v is None or isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v)) or v < 0:
            raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")


def _sectors(nbytes: float) -> float:
    """Bytes rounded up to whole 32-byte sectors (the granularity of L2 and DRAM traffic)."""
    return math.ceil(nbytes / SECTOR) * SECTOR


def _spill(read: float, written: float, l2: float) -> float:
    """Written bytes that reach HBM during a launch: those that do not fit in the L2 beside
    what the launch reads (0 when everything fits)."""
    return float(min(written, max(0.0, read + written - l2))) if l2 else float(written)


def _split_rows(kv_tokens: int, splits: int) -> list[int]:
    """KV rows of each split of one block's range: tiles dealt ``ceil(tiles / splits)`` a split."""
    per_split = math.ceil(math.ceil(kv_tokens / KV_TILE) / splits) if kv_tokens else 0
    return [max(0, min(kv_tokens, (j + 1) * per_split * KV_TILE) - j * per_split * KV_TILE) for j in range(splits)]


def _tile_pass(kernel: str, *, batch: int, seq_rows: int, row_tiles: int, tile_rows: int,
               kv_tokens: list[int], splits: int, partials: float, out: float, vis: float, resident: int,
               l2_bytes: float, halves: bool = True) -> Launch:
    """One launch of a fused tile kernel (``cuda/attention_tile.cuh``) over a sequence's KV rows.

    ``kv_tokens`` is the KV range each row tile's blocks walk: a block's range ends after the last
    tree node among its rows (``fused_block``), since the tree rows after it are no row's
    ancestors; the last row tile walks the whole range.

    Blocks are (row tile, split, sequence), row tile fastest, one resident per SM (the kernel's
    shared memory), so they run in waves of ``resident``. Each block loads its Q tile and every
    KV tile of its split with 16-byte ``cp.async`` (L2 -> SM: the Q tile once per split, its KV
    range once per row tile), then writes its rows: partials and their fp32 lse (``partials``) or
    the bf16 output and lse (``out``). Where the rows are bf16 (the output always; the partials
    unless ``halves`` is False, as for the fp32 partials of kernels before them) each thread
    stores 4 bytes of a row, so a 32-byte sector arrives as two 16-byte halves, two sector writes
    at the L2; fp32 partial rows fill whole sectors.

    HBM, each launch on a flushed L2: Q, the visibility rows and each sequence's (split's) KV
    range once, plus a KV range again in every later wave that holds blocks of its group when
    the wave before it touched more than the L2 holds (B = 4, N = 129, P = 16384: three of
    four 19 MB ranges read twice). The footprint counts the copies the L2's two partitions
    keep: :data:`SHARED_COPY` for KV read by SMs of both halves, :data:`FAR_COPY` for rows one
    SM reads. Written bytes reach HBM during the launch only beyond what the L2 holds, and never
    those of the last wave (written at the end, they are still in the L2 when the launch ends).
    """
    rows_of = [_split_rows(r, splits) for r in kv_tokens]         # [row tile][split]
    group_rows = [max(col) for col in zip(*rows_of)]         # a split's KV: its widest row tile's
    q = batch * seq_rows * KV_ROW_BYTES
    blocks = batch * splits * row_tiles
    q_block = q / (batch * row_tiles)
    written = partials if partials else out
    per_block = written / blocks
    kv_read = batch * sum(group_rows) * KV_ROW_BYTES         # HBM: each sequence's range once
    kv_l2 = batch * sum(map(sum, rows_of)) * KV_ROW_BYTES    # L2 -> SM: once per row tile
    q_l2 = batch * q_block * sum(1 for rows in rows_of for r in rows if r > 0)  # splits with tiles load Q
    l2_read = q_l2 + kv_l2 + vis
    # waves: the KV each one touches (one read per group of blocks) and its distinct Q tiles
    waves = math.ceil(blocks / resident)
    merged, reread, last_foot = vis, 0.0, 0.0
    for w in range(waves):
        lo, hi = w * resident, min(blocks, (w + 1) * resident)
        groups = range(lo // row_tiles, (hi - 1) // row_tiles + 1)    # group = (sequence, split)
        kv_w = sum(group_rows[g % splits] for g in groups) * KV_ROW_BYTES
        if splits == 1:
            q_tiles = hi - lo
        else:
            q_tiles = len({(i // (row_tiles * splits), i % row_tiles) for i in range(lo, hi)})
        merged += kv_w + q_tiles * q_block
        if w and last_foot > l2_bytes:                 # groups continued from the wave before: read again
            first = lo // row_tiles
            if first * row_tiles < lo:
                reread += group_rows[first % splits] * KV_ROW_BYTES
        last_foot = SHARED_COPY * kv_w + FAR_COPY * (hi - lo) * q_block + (hi - lo) * per_block
    footprint = SHARED_COPY * kv_read + FAR_COPY * q + written
    last_wave = (blocks - (waves - 1) * resident) * per_block
    spill = float(min(written - last_wave, max(0.0, footprint - l2_bytes))) if l2_bytes else float(written)
    bf16_sets = 1 if not partials else splits if halves else 0     # row sets written as bf16 halves
    l2_write = written + bf16_sets * batch * seq_rows * V_DIM * BF16   # a half: a second sector write
    tile_flops = tile_rows * KV_TILE * ATTN_FLOPS_PER_TOKEN
    flops_exec = batch * sum(math.ceil(r / KV_TILE) for r in kv_tokens) * tile_flops
    block_tiles = max(math.ceil(r / KV_TILE) for rows in rows_of for r in rows)
    return Launch(kernel, flops_exec, q + kv_read + reread + vis, max(spill, 0.0), l2_read, l2_write,
                  l2_shared=l2_read - merged, blocks=blocks, slots=resident, waves=waves, block_tiles=block_tiles,
                  flops_waves=float(waves * resident * block_tiles * tile_flops))


# Bytes per value of the split partials' O, by dtype name (the lse is fp32 either way).
PARTIAL_DTYPES = {"bfloat16": BF16, "float32": F32}
# Where a block's KV range ends: after the last tree node among its rows (``node``, the kernels
# now), or after the whole tree (``full``, calls recorded before; their records name no range).
KV_RANGES = ("node", "full")


def _current_partials() -> str:
    """The dtype name of the partials the kernels write now (``attention.PARTIAL_DTYPE``)."""
    from kdtree.attention import PARTIAL_DTYPE

    return str(PARTIAL_DTYPE).removeprefix("torch.")


def _plan(variant: str, batch: int, nodes: int, heads: int, kv_rows: int, num_sms: int, impl: str | None,
          splits: int | None, layout: str | None = None):
    from kdtree.attention import launch_plan

    base = "fused" if variant.startswith("fused") else variant
    if impl is None and variant == "fused_mma":
        impl = "mma"
    kw = {} if layout is None else {"layout": layout}
    return launch_plan(base, batch=batch, nodes=nodes, heads=heads, kv_rows=kv_rows, num_sms=num_sms,
                       impl=impl, splits=splits, **kw)


def verify_attention_cost(variant: str, *, batch: int, nodes: int, heads: int, prefix: int,
                          tree_visible: float | None = None, kv_rows: int | None = None,
                          num_sms: int = H200_SMS, impl: str | None = None, splits: int | None = None,
                          layout: str | None = None, l2_bytes: float = H200_L2_BYTES,
                          partials: str | None = None, kv_range: str = "node") -> Cost:
    """FLOPs and bytes of one tree-verify MLA attention call, launch by launch.

    Parameters
    ----------
    variant : str
        ``naive``, ``cascade``, ``fused``, ``fused_mma`` (fused on the mma.sync kernel) or
        ``torch``; other names get the minimum bytes and a note saying no model exists.
    batch, nodes, heads, prefix : int
        B, N (= budget + 1 = q_len), H (heads on this GPU) and P (prefix length).
    tree_visible : float, optional
        Mean number of tree nodes a node sees (its ancestors and itself). Defaults to
        (N + 1) / 2, the causal-mask average; pass the tree's mean depth + 1 when known.
    kv_rows : int, optional
        S, the cache length (default P + N); the launch plan's split count depends on it.
    num_sms, impl, splits, layout
        As for ``kdtree.attention.launch_plan`` (``impl`` defaults to ``attention.SM90_IMPL``, ``mma``
        for ``fused_mma``; ``splits`` and ``layout`` force the recorded plan).
    l2_bytes : float
        L2 capacity: written bytes beyond what fits beside the inputs reach HBM.
    partials : str, optional
        The split partials' dtype, ``bfloat16`` or ``float32``: default the kernels' own
        (``attention.PARTIAL_DTYPE``); ``float32`` models calls profiled before the partials went
        bf16 (their records name no dtype).
    kv_range : str
        Where a block's KV range ends (:data:`KV_RANGES`): ``node``, after the last tree node
        among its rows, as the kernels walk it; ``full`` models calls recorded before they did.

    Returns
    -------
    Cost
    """
    _positive(batch=batch, nodes=nodes, heads=heads, prefix=prefix, num_sms=num_sms, l2_bytes=l2_bytes)
    partials = partials or _current_partials()
    if partials not in PARTIAL_DTYPES:
        raise ValueError(f"partials: expected one of {tuple(PARTIAL_DTYPES)}, got {partials!r}")
    if kv_range not in KV_RANGES:
        raise ValueError(f"kv_range: expected one of {KV_RANGES}, got {kv_range!r}")
    if nodes < 1 or heads < 1 or batch < 1:
        raise ValueError(f"batch, nodes and heads must be >= 1, got batch={batch}, nodes={nodes}, heads={heads}")
    tv = (nodes + 1) / 2 if tree_visible is None else float(tree_visible)
    if not 1 <= tv <= nodes:
        raise ValueError(f"tree_visible: expected 1..{nodes}, got {tree_visible!r}")
    B, N, H, P = int(batch), int(nodes), int(heads), int(prefix)
    S = P + N if kv_rows is None else int(kv_rows)
    rows = B * N * H                                    # (query row x head) pairs
    visible = P + tv                                    # KV tokens each row attends to
    flops = rows * visible * ATTN_FLOPS_PER_TOKEN
    q = rows * KV_DIM * BF16
    out = rows * V_DIM * BF16 + rows * F32              # bf16 output + fp32 lse
    kv = B * (P + N) * KV_ROW_BYTES
    vis = B * N * math.ceil(N / 64) * 8
    bytes_min = q + out + kv + vis
    if variant == "torch":
        scores = B * H * N * (P + N) * F32
        read = bytes_min - out + kv * V_DIM / KV_DIM
        moved = read + out + 4 * scores
        part = Launch("torch ops", flops, read, _spill(read, out + 2 * scores, l2_bytes), moved - out, out, count=8)
        return Cost(flops, bytes_min, "fp32", (part,), "float32 reference: materialises the score matrix",
                    float(l2_bytes))
    if variant == "naive":
        reread = rows * visible * KV_ROW_BYTES
        part = Launch("verify_naive", flops, q + kv + vis, _spill(q + kv + vis, out, l2_bytes),
                      q + vis + reread / NAIVE_RESIDENT, out)
        return Cost(flops, bytes_min, "fp32", (part,),
                    f"re-reads the latent per head and query ({(q + reread + out) / bytes_min:.0f}x the minimum bytes)",
                    float(l2_bytes))
    if not (variant.startswith("fused") or variant == "cascade"):
        part = Launch(variant, flops, bytes_min - out, out, bytes_min - out, out)
        return Cost(flops, bytes_min, "tensor", (part,),
                    f"no byte model for variant {variant!r}; minimum bytes assumed", float(l2_bytes))

    plan = _plan(variant, B, N, H, S, num_sms, impl, splits, layout)
    # rows_n entries carry their warpgroup split as a suffix (verify_fused_rows_n24...)
    # the wgmma kernels (v4, the v6 tma kernels, v8 pair) move the same tiles; the name joins the counters
    kernel = ("verify_fused_rows_n" if plan.layout == "rows_n" and plan.impl == "wgmma"
              else "verify_fused" if plan.impl == "mma" else f"verify_fused_{plan.impl}")
    row_tiles = math.ceil(N * H / plan.tile_rows)       # per sequence; each reads its KV range once
    padded = B * row_tiles * plan.tile_rows
    part_bytes = rows * (V_DIM * PARTIAL_DTYPES[partials] + F32)     # one partial set (o, fp32 lse)

    # a row tile's tree rows end after its last node (``fused_block``): the ranges of fused / tree passes
    tree_ends = [min(N, ((r + 1) * plan.tile_rows - 1) // H + 1) if kv_range == "node" else N
                 for r in range(row_tiles)]

    def pass_launch(kv_tokens: list[int], slots: int) -> Launch:
        return _tile_pass(kernel, batch=B, seq_rows=N * H, row_tiles=row_tiles, tile_rows=plan.tile_rows,
                          kv_tokens=kv_tokens, splits=max(slots, 1), partials=slots * part_bytes, out=out,
                          vis=vis, resident=num_sms, l2_bytes=l2_bytes, halves=partials == "bfloat16")

    def combine(slots: int) -> Launch:
        read = slots * part_bytes
        return Launch("verify_combine", 0.0, read, _spill(FAR_COPY * read, out, l2_bytes), read, out, carried=read)

    if variant == "cascade":
        parts = (pass_launch([P] * row_tiles, plan.splits), pass_launch(tree_ends, 1), combine(plan.partial_slots))
        note = (f"prefix pass ({plan.splits} split{'s' if plan.splits > 1 else ''}) + tree pass + lse merge: "
                f"{plan.launches} launches, {plan.partial_slots} partial sets")
    elif plan.head:
        parts = (_head_tail_pass(pass_launch, [P + e for e in tree_ends], plan, B * row_tiles, num_sms),
                 combine(_head_tail_share(plan, B * row_tiles)))
        note = (f"single pass on tensor cores: {plan.head} row tiles in {plan.splits} KV split"
                f"{'s' if plan.splits > 1 else ''}, the other {B * row_tiles - plan.head} in {plan.tail_splits}, "
                f"partials merged by a second launch")
    elif plan.partial_slots:
        parts = (pass_launch([P + e for e in tree_ends], plan.splits), combine(plan.partial_slots))
        note = (f"single pass on tensor cores in {plan.splits} KV splits: partials "
                f"({plan.partial_slots * part_bytes / 1e6:.1f} MB) written and merged by a second launch")
    else:
        parts = (pass_launch([P + e for e in tree_ends], 0),)
        note = "single pass on tensor cores"
    pad = padded / rows
    if pad > 1.05:
        note += f" ({pad:.2f}x rows computed: tiles of {plan.tile_rows})"
    return Cost(flops, bytes_min, "tensor", parts, note, float(l2_bytes))


def _head_tail_share(plan, row_tiles: int) -> float:
    """Partial sets a head/tail launch writes, in whole-call sets: the tail's row tiles write
    ``tail_splits`` each, the head's ``splits`` each where split (none where whole)."""
    head = plan.head / row_tiles
    return head * (plan.splits if plan.splits > 1 else 0) + (1.0 - head) * plan.tail_splits


def _head_tail_pass(pass_launch, kv_tokens: list[int], plan, row_tiles: int, num_sms: int) -> Launch:
    """The one launch of a head/tail plan (``attention.choose_tail``): the head's share of a
    uniform pass at ``splits`` plus the tail's share of one at ``tail_splits`` (bytes and FLOPs
    by row tiles), its schedule as the SMs take the blocks in order (``attention._makespan``,
    with each block's tiles alone: the whole-wave roof)."""
    from kdtree.attention import _makespan

    head, tail = plan.head / row_tiles, 1.0 - plan.head / row_tiles
    h = pass_launch(kv_tokens, plan.splits if plan.splits > 1 else 0)
    t = pass_launch(kv_tokens, plan.tail_splits)
    mix = {f: getattr(h, f) * head + getattr(t, f) * tail
           for f in ("flops_exec", "dram_read", "dram_write", "l2_read", "l2_write", "l2_shared")}
    tiles = max(math.ceil(r / KV_TILE) for r in kv_tokens)
    n_head, n_tail = plan.head * plan.splits, (row_tiles - plan.head) * plan.tail_splits
    span = _makespan(n_head, math.ceil(tiles / plan.splits), n_tail, math.ceil(tiles / plan.tail_splits), num_sms)
    tile_flops = h.flops_waves / (h.waves * h.slots * h.block_tiles)
    return Launch(h.kernel, **mix, blocks=n_head + n_tail, slots=num_sms, waves=-(-(n_head + n_tail) // num_sms),
                  block_tiles=h.block_tiles, flops_waves=span * num_sms * tile_flops)


def launch_plan_columns(variant: str, *, batch: int, nodes: int, heads: int, kv_rows: int,
                        num_sms: int = H200_SMS, impl: str | None = None) -> dict:
    """``splits``, ``tail_splits`` (a head/tail launch's tail, 0 for none), ``layout``, ``impl``,
    ``partials`` (the split partials' dtype) and ``kv_range`` (where a block's KV range ends,
    :data:`KV_RANGES`) of a verify-attention call, for its results row (empty strings and 1 split
    for variants without a launch plan)."""
    if not (variant.startswith("fused") or variant in ("cascade", "naive")):
        return {"splits": 1, "tail_splits": 0, "layout": "", "impl": variant, "partials": "", "kv_range": ""}
    p = _plan(variant, batch, nodes, heads, kv_rows, num_sms, impl, None)
    tiled = variant != "naive"
    return {"splits": p.splits, "tail_splits": p.tail_splits, "layout": p.layout, "impl": p.impl,
            "partials": _current_partials() if tiled else "", "kv_range": KV_RANGES[0] if tiled else ""}


def build_tree_cost(variant: str, *, batch: int, budget: int, depth: int, topk: int | None = None,
                    token_bytes: int = 8, l2_bytes: float = H200_L2_BYTES) -> Cost:
    """Bytes of one tree build: one launch, one block per sequence (no floating-point work
    to speak of). Both paths (``parallel`` threshold selection and the ``heap``) first copy the
    sequence's ``depth x topk`` float32 log-probs into shared memory, then read one token id
    (``token_bytes``) per selected node and write tokens, parents, depth (int32), the node
    count and the visibility bitmask of N nodes. CPU variants (``cpu_*``) get the same bytes.
    """
    _positive(batch=batch, budget=budget, depth=depth)
    topk = budget if topk is None else topk
    n = budget + 1
    lp = batch * _sectors(depth * topk * F32)
    tok = batch * min(_sectors(depth * topk * token_bytes), _sectors(budget * token_bytes) + depth * SECTOR)
    written = batch * (3 * n * 4 + 4 + n * math.ceil(n / 64) * 8)
    read = lp + tok
    path = {"parallel": "parallel threshold selection, one block per sequence",
            "heap": "serial best-first heap, one warp per sequence",
            "gpu_heap": "serial best-first heap, one warp per sequence"}.get(
        variant, "best-first tree build, one block per sequence")
    part = Launch("build_tree", 0.0, read, _spill(read, written, l2_bytes), read, written)
    return Cost(0.0, batch * (depth * topk * F32 + budget * token_bytes) + written, "none", (part,), path,
                float(l2_bytes))


def accept_tree_cost(variant: str, *, batch: int, budget: int, depth: int, target_bytes: int = 8,
                     l2_bytes: float = H200_L2_BYTES) -> Cost:
    """Bytes of one accept walk: tree tokens and parents (int32) and the target's tokens in,
    indices, length and bonus out."""
    _positive(batch=batch, budget=budget, depth=depth)
    n = budget + 1
    read = batch * (2 * _sectors(n * 4) + _sectors(n * target_bytes) + SECTOR)
    written = batch * ((depth + 1) * 4 + 8)
    part = Launch("accept_tree", 0.0, read, _spill(read, written, l2_bytes), read, written)
    return Cost(0.0, batch * (n * (8 + target_bytes) + 4) + written, "none", (part,),
                "pointer-chasing walk from the root", float(l2_bytes))


def compact_kv_cost(variant: str, *, batch: int, depth: int, accepted: float | None = None,
                    moved: float | None = None, row_bytes: int = KV_ROW_BYTES,
                    l2_bytes: float = H200_L2_BYTES) -> Cost:
    """Bytes of one KV compaction: every accepted row that changes place read and written once.

    ``accepted`` is the mean accepted length (root included; default ``depth + 1``, the most);
    ``moved`` the mean rows per sequence that change place (default ``accepted - 1``: the
    root stays; the kernel skips a row already in place).
    """
    _positive(batch=batch, depth=depth)
    acc = (depth + 1) if accepted is None else float(accepted)
    rows = max(acc - 1, 0.0) if moved is None else float(moved)
    data = batch * rows * row_bytes
    meta = batch * 3 * SECTOR                      # prefix length, length, indices
    part = Launch("compact_kv", 0.0, data + meta, _spill(data + meta, data, l2_bytes), data + meta, data)
    return Cost(0.0, 2 * data, "none", (part,), "row copy of the accepted KV", float(l2_bytes))


def accept_compact_cost(variant: str, *, batch: int, budget: int, depth: int, accepted: float | None = None,
                        moved: float | None = None, l2_bytes: float = H200_L2_BYTES) -> Cost:
    """Accept walk followed by KV compaction, as one step (two launches)."""
    a = accept_tree_cost(variant, batch=batch, budget=budget, depth=depth, l2_bytes=l2_bytes)
    c = compact_kv_cost(variant, batch=batch, depth=depth, accepted=accepted, moved=moved, l2_bytes=l2_bytes)
    return Cost(0.0, a.bytes_min + c.bytes_min, "none", a.parts + c.parts,
                "accept walk, then row copy of the accepted KV", float(l2_bytes))


MODELS = {
    "verify_attention": verify_attention_cost,
    "build_tree": build_tree_cost,
    "accept_tree": accept_tree_cost,
    "compact_kv": compact_kv_cost,
    "accept+compact": accept_compact_cost,
}

# Result-table column -> model argument, per kernel; optional ones ("?") may be absent.
_ARGS = {
    "verify_attention": {"batch": "batch", "nodes": "q_len", "heads": "heads", "prefix": "prefix",
                         "tree_visible": "tree_visible?", "kv_rows": "kv_rows?", "impl": "impl?",
                         "splits": "splits?", "layout": "layout?", "partials": "partials?",
                         "kv_range": "kv_range?"},
    "build_tree": {"batch": "batch", "budget": "budget", "depth": "depth", "topk": "topk?"},
    "accept_tree": {"batch": "batch", "budget": "budget", "depth": "depth"},
    "compact_kv": {"batch": "batch", "depth": "depth", "accepted": "accepted?", "moved": "moved?"},
    "accept+compact": {"batch": "batch", "budget": "budget", "depth": "depth", "accepted": "accepted?",
                       "moved": "moved?"},
}
_FLOAT_ARGS = ("tree_visible", "accepted", "moved")
_ALIASES = {"build": "build_tree", "tree_build": "build_tree", "accept": "accept_tree", "compact": "compact_kv",
            "compaction": "compact_kv", "attention": "verify_attention", "verify": "verify_attention"}


def kernel_name(name: str) -> str:
    """Canonical kernel name: ``build_tree``, ``accept_tree``, ``compact_kv``, ``accept+compact``
    or ``verify_attention`` (the benches' short names ``build``, ``accept``, ``compact`` map here)."""
    return _ALIASES.get(name, name)


def cost_for_row(row, l2_bytes: float | None = None) -> Cost | None:
    """The cost of one result row (a mapping with ``kernel``, ``variant`` and shape columns).

    ``q_len`` may be given as ``budget`` (q_len = budget + 1) and ``depth`` defaults to 15.
    ``impl``, ``splits``, ``layout``, ``partials`` and ``kv_range`` columns, where a row records them, fix the
    verify launch plan (``naive``, ``torch`` and CPU rows ignore them). ``l2_bytes``: the
    device's L2 (default the H200's). Returns None for kernels without a model.
    """
    kernel = kernel_name(str(row.get("kernel")))
    if kernel not in MODELS:
        return None
    variant = str(row.get("variant") if _present(row.get("variant")) else row.get("path", "?"))
    values = dict(row)
    if not _present(values.get("q_len")) and _present(values.get("budget")):
        values["q_len"] = int(values["budget"]) + 1
    if not _present(values.get("depth")):
        values["depth"] = 15
    from kdtree.attention import FUSED_IMPLS, LAYOUTS

    str_args = {"impl": FUSED_IMPLS, "layout": LAYOUTS, "partials": tuple(PARTIAL_DTYPES), "kv_range": KV_RANGES}
    planned = kernel == "verify_attention" and (variant.startswith("fused") or variant == "cascade")
    kwargs = {} if l2_bytes is None else {"l2_bytes": float(l2_bytes)}
    for arg, col in _ARGS[kernel].items():
        optional = col.endswith("?")
        col = col.rstrip("?")
        v = values.get(col)
        if arg in ("impl", "splits", "layout", "partials", "kv_range") and not planned:
            continue
        if _present(v) and not (arg in str_args and v not in str_args[arg]):
            kwargs[arg] = float(v) if arg in _FLOAT_ARGS else str(v) if arg in str_args else int(v)
        elif not optional:
            raise ValueError(f"{kernel} row needs column {col!r} for its cost model; row has {sorted(values)}")
    if planned and _present(values.get("tail_splits")) and int(values["tail_splits"]) > 0:
        kwargs.pop("splits", None)   # a head/tail launch: the plan (choose_tail) gives it again; forced splits would not
    return MODELS[kernel](variant, **kwargs)


def _present(v) -> bool:
    return v is not None and v != "" and not (isinstance(v, float) and math.isnan(v))

"""Device ceilings, measured once per run: the roofs every kernel is judged against.

On a GPU: HBM bandwidth as the best of three probes over buffers of 2 GiB or more (a read-only
kernel, a write-only kernel and a torch copy; each probe's figure is kept in ``probes`` with
its method), L2 bandwidth (a read kernel over a buffer resident in the L2), the dense bf16
tensor-core rate and the plain fp32 FMA rate (matrix products, TF32 off for fp32), the
per-launch latency of a tiny kernel eager and inside a graph, and the host floor of each of
kdtree's ops (``eager_floor_us``: the eager time of the op at a trivial size, through the
package's own Python path), which eager timings are compared with instead of a device roof.
Datasheet numbers ride along as labels only.

Without a GPU the same fields are filled with host numbers (DRAM and cache copy bandwidth,
CPU matrix-product rates, torch op overhead) and the set is labelled ``kind="cpu"``, so the
notebooks and reports run unchanged in CI while nobody mistakes it for a GPU roofline.
"""
from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from kdtree.bench.atomic import write_text
from kdtree.bench.timing import time_events, time_graph, time_held, time_host

# Vendor datasheet values (SXM parts): labels for the figures, never used as roofs.
DATASHEET = {
    "H200": {"hbm_bw": 4.8e12, "tensor_flops": 989e12, "fp32_flops": 67e12},
    "H100": {"hbm_bw": 3.35e12, "tensor_flops": 989e12, "fp32_flops": 67e12},
}

# (field, unit label, scale) for tables and captions.
FIELDS = (
    ("hbm_bw", "TB/s", 1e12),
    ("l2_bw", "TB/s", 1e12),
    ("tensor_flops", "TFLOP/s", 1e12),
    ("fp32_flops", "TFLOP/s", 1e12),
    ("launch_eager_us", "us", 1.0),
    ("launch_graph_us", "us", 1.0),
)


@dataclass
class Ceilings:
    """Measured roofs of one device.

    Attributes
    ----------
    device : str
        Device name as torch reports it (``"CPU (...)"`` on a host-only run).
    kind : str
        ``"gpu"`` or ``"cpu"``; a CPU set is host numbers, not a GPU roofline.
    hbm_bw, l2_bw : float
        Copy bandwidth in bytes/s, bytes read plus bytes written.
    tensor_flops, fp32_flops : float
        Dense bf16 tensor-core and plain fp32 FMA rates in FLOP/s.
    launch_eager_us, launch_graph_us : float
        Per-call time of a one-element kernel, eager and inside a CUDA graph (NaN on CPU).
    tensor_clock_mhz : float
        Median SM clock sampled while the bf16 rate was measured (NaN on CPU and in files
        written before it was recorded). The tensor-core roofs hold at this clock; a point whose
        SM ran slower (a power or thermal limit) had a lower roof (``kdtree.bench.roofline``).
    l2_bytes : int or None
        L2 size; data smaller than this can stay resident between warm-L2 calls.
    methods : dict
        How each field was measured.
    probes : dict
        Every bandwidth probe's figure in bytes/s (``hbm_read``, ``hbm_write``, ``hbm_copy``...).
    eager_floor_us : dict
        Per op (``verify_attention``, ``build_tree``, ``accept_tree``, ``compact_kv``): the eager
        time of one call at a trivial size through kdtree's Python path (empty on CPU).
    """

    device: str
    kind: str
    hbm_bw: float
    l2_bw: float
    tensor_flops: float
    fp32_flops: float
    launch_eager_us: float
    launch_graph_us: float
    tensor_clock_mhz: float = math.nan
    l2_bytes: int | None = None
    methods: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)
    eager_floor_us: dict = field(default_factory=dict)

    @property
    def datasheet(self) -> dict:
        """Datasheet values for this device (empty when unknown); labels only."""
        for name, values in DATASHEET.items():
            if name in self.device:
                return values
        return {}

    def launch_us(self, mode: str) -> float:
        """Launch floor of one call for a timing ``mode`` (``eager``, ``graph`` or ``host``)."""
        if mode == "graph":
            return self.launch_graph_us
        if mode in ("eager", "host"):
            return self.launch_eager_us
        raise ValueError(f"mode: expected 'eager', 'graph' or 'host', got {mode!r}")

    def eager_floor(self, kernel: str, launches: int = 1) -> float:
        """Host floor in microseconds of an eager call of ``kernel`` that takes ``launches``
        launches: the op's measured floor plus one eager launch per further launch (the bare
        eager launch latency per launch when the op was not measured)."""
        base = self.eager_floor_us.get(kernel)
        if base is None:
            return launches * self.launch_eager_us
        return base + max(launches - 1, 0) * self.launch_eager_us

    def caption(self) -> str:
        """One line naming the device and its measured ceilings, for figure subtitles."""
        def num(x, scale):
            return "n/a" if x is None or not math.isfinite(x) else f"{x / scale:.3g}"
        tag = "" if self.kind == "gpu" else " [CPU host ceilings, not a GPU roofline]"
        return (f"{self.device}{tag} | HBM {num(self.hbm_bw, 1e12)} TB/s | L2 {num(self.l2_bw, 1e12)} TB/s"
                f" | bf16 TC {num(self.tensor_flops, 1e12)} TFLOP/s{self._at_clock()} | fp32 {num(self.fp32_flops, 1e12)} TFLOP/s"
                f" | launch {num(self.launch_eager_us, 1)} us eager, {num(self.launch_graph_us, 1)} us graph")

    def _at_clock(self) -> str:
        return f" at {self.tensor_clock_mhz:.0f} MHz" if self.tensor_clock_mhz > 0 else ""

    def table(self) -> pd.DataFrame:
        """The ceilings as a tidy table: ceiling, value, unit, datasheet value, method."""
        sheet = self.datasheet
        rows = []
        for name, unit, scale in FIELDS:
            value = getattr(self, name)
            ds = sheet.get(name)
            rows.append({"device": self.device, "kind": self.kind, "ceiling": name,
                         "value": value / scale, "unit": unit,
                         "datasheet": ds / scale if ds is not None else float("nan"),
                         "method": self.methods.get(name, "")})
        if self.tensor_clock_mhz > 0:
            rows.append({"device": self.device, "kind": self.kind, "ceiling": "tensor_clock_mhz",
                         "value": self.tensor_clock_mhz, "unit": "MHz", "datasheet": float("nan"),
                         "method": "median SM clock sampled while tensor_flops was measured"})
        for name, value in self.probes.items():
            rows.append({"device": self.device, "kind": self.kind, "ceiling": f"probe:{name}",
                         "value": value / 1e12, "unit": "TB/s", "datasheet": float("nan"),
                         "method": self.methods.get(f"probe:{name}", "")})
        for name, value in self.eager_floor_us.items():
            rows.append({"device": self.device, "kind": self.kind, "ceiling": f"eager_floor:{name}",
                         "value": value, "unit": "us", "datasheet": float("nan"),
                         "method": self.methods.get("eager_floor_us", "")})
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Write the ceilings as JSON, whole or not at all (a unique temporary name, then a rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_text(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Ceilings":
        """Read ceilings written by :meth:`save`."""
        data = json.loads(Path(path).read_text())
        missing = {f for f, _, _ in FIELDS} - data.keys()
        if missing:
            raise ValueError(f"{path}: not a ceilings file (missing {sorted(missing)})")
        return cls(**data)


def _device_us(fn, *, reps: int, l2: str, capture: bool = True):
    """A device ceiling's timing with no host time in its span: ``fn`` alone in a CUDA graph
    replayed behind a device hold (:func:`~kdtree.bench.timing.time_graph`), or with
    ``capture=False`` launched eagerly behind one (:func:`~kdtree.bench.timing.time_held`).
    Timed eagerly on an idle GPU, the start event fired at once and the launch's host dispatch
    (10-40 us, with the host's speed) joined a ~0.5 ms probe: the same H200's 2 GiB read probe
    gave 4.28 TB/s in one run and 4.46 TB/s in its twin, whose kernel times agreed within 0.5%."""
    if capture:
        return time_graph(fn, reps=reps, calls_per_graph=1, warmup=3, l2=l2)
    return time_held(fn, reps=reps, warmup=3, l2=l2)


def _copy_bw(nbytes: int, device: str, *, reps: int) -> float:
    """Copy bandwidth (read + write) of a ``nbytes`` buffer, in bytes/s (on a GPU by
    :func:`_device_us`, eagerly: a captured copy runs as graph memcpy nodes, not as the copy
    kernel an eager ``copy_`` launches)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    t = time_host(fn, reps=reps) if device == "cpu" else _device_us(fn, reps=reps, l2="cold", capture=False)
    return 2 * src.numel() * 4 / (t.median_us * 1e-6)


def _matmul_rate(n: int, dtype: torch.dtype, device: str, *, reps: int) -> tuple[float, float]:
    """FLOP/s of an n x n x n matrix product on random data (on a GPU by :func:`_device_us`), and
    the median SM clock in MHz sampled while it ran (NaN on the host)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    fn = lambda: torch.mm(a, b, out=out)  # noqa: E731
    t = time_host(fn, reps=reps) if device == "cpu" else _device_us(fn, reps=reps, l2="warm")
    return 2 * n ** 3 / (t.median_us * 1e-6), t.sm_clock_mhz


def _probe_kernel(name: str):
    from kdtree.kernels import get_kernel

    return get_kernel("probes", name)


def _read_bw(buf: torch.Tensor, passes: int, *, reps: int, l2: str) -> tuple[float, float]:
    """Bytes/s of ``read_probe`` over ``buf`` (float32, a multiple of 4 values), ``passes``
    passes per launch, by :func:`_device_us`; ``l2="cold"`` flushes the L2 before each launch. Returns
    (bytes/s, median SM clock in MHz sampled while it ran)."""
    import numpy as np

    from kdtree.kernels import launch, ptr

    fn = _probe_kernel("read_probe")
    sink = torch.zeros(1, device=buf.device)
    n = buf.numel() // 4
    sms = torch.cuda.get_device_properties(buf.device).multi_processor_count
    run = lambda: launch(fn, (8 * sms,), (256,), (ptr(buf), np.int64(n), np.int32(passes),  # noqa: E731
                                                  np.float32(-1.0), ptr(sink)))
    t = _device_us(run, reps=reps, l2=l2)
    return n * 16 * passes / (t.median_us * 1e-6), t.sm_clock_mhz


def _write_bw(buf: torch.Tensor, *, reps: int) -> float:
    """Bytes/s of ``write_probe`` over ``buf`` by :func:`_device_us`, L2 flushed before each launch."""
    import numpy as np

    from kdtree.kernels import launch, ptr

    fn = _probe_kernel("write_probe")
    n = buf.numel() // 4
    sms = torch.cuda.get_device_properties(buf.device).multi_processor_count
    run = lambda: launch(fn, (8 * sms,), (256,), (ptr(buf), np.int64(n), np.float32(1.0)))  # noqa: E731
    t = _device_us(run, reps=reps, l2="cold")
    return n * 16 / (t.median_us * 1e-6)


def trivial_ops() -> dict:
    """kdtree's ops at a trivial size on the current GPU, as the benchmarks call them (values
    unchecked, the default variant): ``verify_attention``, ``build_tree``, ``accept_tree``,
    ``compact_kv`` and ``accept+compact``, name -> call. Their eager time is each op's host floor."""
    import kdtree

    dev = torch.device("cuda")
    lp = torch.log_softmax(torch.randn(1, 1, 2, device=dev), -1).sort(-1, descending=True).values
    tok = torch.arange(2, device=dev).view(1, 1, 2)
    tree = kdtree.build_tree(lp, tok, 1)
    target = tree.tokens.clamp(min=0).to(torch.int64)
    acc = kdtree.accept_tree(tree, target)
    q = torch.randn(1, 2, 8, 576, device=dev).to(torch.bfloat16)
    kv = torch.randn(1, 3, 576, device=dev).to(torch.bfloat16)
    pl = torch.ones(1, dtype=torch.int64, device=dev)
    return {"verify_attention": lambda: kdtree.verify_attention(q, kv, pl, tree, 0.1, check_values=False),
            "build_tree": lambda: kdtree.build_tree(lp, tok, 1, validate=False),
            "accept_tree": lambda: kdtree.accept_tree(tree, target, validate=False),
            "compact_kv": lambda: kdtree.compact_kv(kv, pl, acc, validate=False),
            "accept+compact": lambda: kdtree.compact_kv(kv, pl, kdtree.accept_tree(tree, target, validate=False),
                                                        validate=False)}


def eager_floors(reps: int = 200) -> dict[str, float]:
    """Host floor per op: median eager time (CUDA events around each call, the GPU otherwise
    idle) of one call of :func:`trivial_ops` through kdtree's own Python path."""
    return {k: time_events([fn], reps=reps, warmup=20).median_us for k, fn in trivial_ops().items()}


L2_ATTEMPTS = 3   # resident buffers the L2 read probe tries; the ceiling is the best


def _measure_gpu(quick: bool) -> Ceilings:
    p = torch.cuda.get_device_properties(0)
    l2 = int(p.L2_cache_size)
    reps = 10 if quick else 40
    hbm_bytes = 2 << 30                    # >= 2 GiB per buffer: far past the L2, past any probe's ramp
    resident = max(l2 // 4, 1 << 20)       # a quarter of the L2: stays resident
    passes = 100
    # The L2 probe first, on a cool GPU, each of L2_ATTEMPTS resident buffers newly allocated,
    # 100 passes per launch (~0.2 ms on an H200). Run after the HBM probes and the matmuls with
    # 20 passes, it gave 5.4-5.9 TB/s in five of six buffers of one call and 7.5-8.2 TB/s alone
    # on the same machine minutes later (results/gpu_suite_h200_841e675/l2.txt,
    # results/host_timing_h200/l2probe.txt): the previous probes' power draw and the short
    # launches' ramp both cost it.
    attempts = []
    for _ in range(L2_ATTEMPTS):
        small = torch.empty(resident // 4, device="cuda").uniform_()
        attempts.append(_read_bw(small, passes, reps=reps, l2="warm"))
        del small
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fp32, _ = _matmul_rate(2048 if quick else 4096, torch.float32, "cuda", reps=reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    big = torch.empty(hbm_bytes // 4, device="cuda").uniform_()
    probes = {"hbm_read": _read_bw(big, 1, reps=reps, l2="cold")[0], "hbm_write": _write_bw(big, reps=reps)}
    del big
    torch.cuda.empty_cache()
    probes["hbm_copy"] = _copy_bw(hbm_bytes, "cuda", reps=reps)
    torch.cuda.empty_cache()
    probes["l2_read"] = max(bw for bw, _ in attempts)
    best = max(("hbm_read", "hbm_write", "hbm_copy"), key=probes.get)
    x = torch.zeros(1, device="cuda")
    tiny = lambda: x.add_(1)  # noqa: E731
    gib = hbm_bytes >> 30
    methods = {
        "probe:hbm_read": f"read_probe kernel (16-byte loads) over {gib} GiB, L2 flushed, CUDA-graph replay",
        "probe:hbm_write": f"write_probe kernel (16-byte stores) over {gib} GiB, L2 flushed, CUDA-graph replay",
        "probe:hbm_copy": f"torch copy of {gib} GiB, L2 flushed, eager behind a device hold, CUDA events; read + write bytes",
        "probe:l2_read": f"read_probe kernel, {passes} passes over {resident >> 20} MiB resident in the "
                         f"{l2 >> 20} MiB L2, warm, CUDA-graph replay, before the other probes; best of {L2_ATTEMPTS} buffers ("
                         + ", ".join(f"{bw / 1e12:.3g} TB/s at {mhz:.0f} MHz" for bw, mhz in attempts) + ")",
        "hbm_bw": f"best of the HBM probes: {best} ({probes[best] / 1e12:.3g} TB/s)",
        "l2_bw": "probe:l2_read (L2 -> SM reads of a resident buffer)",
        "tensor_flops": "torch.mm bf16 on random data, CUDA-graph replay (tensor_clock_mhz: its median SM clock)",
        "fp32_flops": "torch.mm fp32 with TF32 off (SIMT FFMA), CUDA-graph replay",
        "launch_eager_us": "one-element add_, CUDA events around each eager launch",
        "launch_graph_us": "one-element add_, 100 per CUDA graph, per-kernel time",
        "eager_floor_us": "kdtree op at a trivial size, eager, CUDA events around each call (Python path included)",
    }
    tensor, tensor_mhz = _matmul_rate(4096 if quick else 8192, torch.bfloat16, "cuda", reps=reps)
    return Ceilings(
        device=p.name, kind="gpu", hbm_bw=probes[best], l2_bw=probes["l2_read"], tensor_flops=tensor,
        fp32_flops=fp32, tensor_clock_mhz=tensor_mhz,
        launch_eager_us=time_events([tiny], reps=200, warmup=20).median_us,
        launch_graph_us=time_graph(tiny, reps=50, calls_per_graph=100).median_us,
        l2_bytes=l2, methods=methods, probes=probes, eager_floor_us=eager_floors())


def _measure_cpu(quick: bool) -> Ceilings:
    reps = 5 if quick else 20
    torch_threads = torch.get_num_threads()
    x = torch.zeros(1)
    return Ceilings(
        device=f"CPU ({platform.processor() or platform.machine()}, timed on 1 of {torch_threads} threads)",  # host_clock
        kind="cpu",
        hbm_bw=_copy_bw(64 << 20, "cpu", reps=reps),
        l2_bw=_copy_bw(256 << 10, "cpu", reps=reps * 10),
        tensor_flops=_matmul_rate(256 if quick else 512, torch.bfloat16, "cpu", reps=reps)[0],
        fp32_flops=_matmul_rate(256 if quick else 512, torch.float32, "cpu", reps=reps)[0],
        launch_eager_us=time_host(lambda: x.add_(1), reps=200).median_us,
        launch_graph_us=float("nan"),
        l2_bytes=None,
        methods={
            "hbm_bw": "host: torch copy of 64 MiB (DRAM), wall clock",
            "l2_bw": "host: torch copy of 256 KiB (cache), wall clock",
            "tensor_flops": "host: torch.mm bf16 (no tensor cores)",
            "fp32_flops": "host: torch.mm fp32",
            "launch_eager_us": "host: torch op overhead of a one-element add_",
            "launch_graph_us": "no CUDA graphs on CPU",
        })


def measure_ceilings(quick: bool = False, device: str = "auto") -> Ceilings:
    """Measure the ceilings of the GPU (or of the host when there is none).

    Parameters
    ----------
    quick : bool
        Smaller problems and fewer repetitions (seconds instead of tens of seconds).
    device : {"auto", "cuda", "cpu"}
        ``auto`` measures the GPU when torch sees one.

    Returns
    -------
    Ceilings
    """
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device: expected 'auto', 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device")
    use_gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return _measure_gpu(quick) if use_gpu else _measure_cpu(quick)


def get_ceilings(path: str | Path | None = None, quick: bool = False) -> Ceilings:
    """The run's ceilings: read from ``path`` when a run measured them already, else measure.

    A file measured on another device is measured again, so a run never mixes machines.
    Fresh measurements are written to ``path`` when one is given.
    """
    here = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
    if path and Path(path).exists():
        c = Ceilings.load(path)
        if (c.kind == "gpu" and c.device == here) or (c.kind == "cpu" and here is None):
            return c
    c = measure_ceilings(quick=quick)
    if path:
        c.save(path)
    return c

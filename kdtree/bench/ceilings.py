"""Device ceilings, measured once per run: the roofs every kernel is judged against.

On a GPU: HBM copy bandwidth (a copy far larger than the L2), L2 bandwidth (a copy that fits
in the L2, replayed in a CUDA graph), the dense bf16 tensor-core rate and the plain fp32 FMA
rate (matrix products, TF32 off for fp32), and the per-launch latency of a tiny kernel eager
and inside a graph. Datasheet numbers ride along as labels only.

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

from kdtree.bench.timing import time_events, time_graph, time_host

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
    l2_bytes : int or None
        L2 size; data smaller than this can stay resident between warm-L2 calls.
    methods : dict
        How each field was measured.
    """

    device: str
    kind: str
    hbm_bw: float
    l2_bw: float
    tensor_flops: float
    fp32_flops: float
    launch_eager_us: float
    launch_graph_us: float
    l2_bytes: int | None = None
    methods: dict = field(default_factory=dict)

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

    def caption(self) -> str:
        """One line naming the device and its measured ceilings, for figure subtitles."""
        def num(x, scale):
            return "n/a" if x is None or not math.isfinite(x) else f"{x / scale:.3g}"
        tag = "" if self.kind == "gpu" else " [CPU host ceilings, not a GPU roofline]"
        return (f"{self.device}{tag} | HBM {num(self.hbm_bw, 1e12)} TB/s | L2 {num(self.l2_bw, 1e12)} TB/s"
                f" | bf16 TC {num(self.tensor_flops, 1e12)} TFLOP/s | fp32 {num(self.fp32_flops, 1e12)} TFLOP/s"
                f" | launch {num(self.launch_eager_us, 1)} us eager, {num(self.launch_graph_us, 1)} us graph")

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
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Write the ceilings as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Ceilings":
        """Read ceilings written by :meth:`save`."""
        data = json.loads(Path(path).read_text())
        missing = {f for f, _, _ in FIELDS} - data.keys()
        if missing:
            raise ValueError(f"{path}: not a ceilings file (missing {sorted(missing)})")
        return cls(**data)


def _copy_bw(nbytes: int, device: str, *, reps: int, graph_calls: int = 0) -> float:
    """Copy bandwidth (read + write) of a ``nbytes`` buffer, in bytes/s."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    if device == "cpu":
        t = time_host(fn, reps=reps)
    elif graph_calls:
        t = time_graph(fn, reps=reps, calls_per_graph=graph_calls)
    else:
        t = time_events([fn], reps=reps, l2="cold")
    return 2 * src.numel() * 4 / (t.median_us * 1e-6)


def _matmul_rate(n: int, dtype: torch.dtype, device: str, *, reps: int) -> float:
    """FLOP/s of an n x n x n matrix product on random data."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    fn = lambda: torch.mm(a, b, out=out)  # noqa: E731
    t = time_host(fn, reps=reps) if device == "cpu" else time_events([fn], reps=reps, warmup=3)
    return 2 * n ** 3 / (t.median_us * 1e-6)


def _measure_gpu(quick: bool) -> Ceilings:
    p = torch.cuda.get_device_properties(0)
    l2 = int(p.L2_cache_size)
    reps = 10 if quick else 40
    hbm_bytes = (1 << 28) if quick else (1 << 30)
    l2_bytes_buf = max(l2 // 4, 1 << 20)   # source + destination fill half the L2
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fp32 = _matmul_rate(2048 if quick else 4096, torch.float32, "cuda", reps=reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    x = torch.zeros(1, device="cuda")
    tiny = lambda: x.add_(1)  # noqa: E731
    return Ceilings(
        device=p.name, kind="gpu",
        hbm_bw=_copy_bw(hbm_bytes, "cuda", reps=reps),
        l2_bw=_copy_bw(l2_bytes_buf, "cuda", reps=reps, graph_calls=100),
        tensor_flops=_matmul_rate(4096 if quick else 8192, torch.bfloat16, "cuda", reps=reps),
        fp32_flops=fp32,
        launch_eager_us=time_events([tiny], reps=200, warmup=20).median_us,
        launch_graph_us=time_graph(tiny, reps=50, calls_per_graph=100).median_us,
        l2_bytes=l2,
        methods={
            "hbm_bw": f"torch copy of {hbm_bytes >> 20} MiB, CUDA events, L2 flushed; read + write bytes",
            "l2_bw": f"torch copy of {l2_bytes_buf >> 20} MiB (L2 is {l2 >> 20} MiB), 100 per CUDA graph",
            "tensor_flops": "torch.mm bf16 on random data, CUDA events",
            "fp32_flops": "torch.mm fp32 with TF32 off (SIMT FFMA), CUDA events",
            "launch_eager_us": "one-element add_, CUDA events around each eager launch",
            "launch_graph_us": "one-element add_, 100 per CUDA graph, per-kernel time",
        })


def _measure_cpu(quick: bool) -> Ceilings:
    reps = 5 if quick else 20
    torch_threads = torch.get_num_threads()
    x = torch.zeros(1)
    return Ceilings(
        device=f"CPU ({platform.processor() or platform.machine()}, {torch_threads} threads)",
        kind="cpu",
        hbm_bw=_copy_bw(64 << 20, "cpu", reps=reps),
        l2_bw=_copy_bw(256 << 10, "cpu", reps=reps * 10),
        tensor_flops=_matmul_rate(256 if quick else 512, torch.bfloat16, "cpu", reps=reps),
        fp32_flops=_matmul_rate(256 if quick else 512, torch.float32, "cpu", reps=reps),
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

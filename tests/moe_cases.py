"""Cases for the grouped-GEMM kernels of ``kdtree.experts``, shared by the GPU tests in
test_moe.py and the compute-sanitizer run (``tests/sanitize_moe.py``)."""
import torch

from kdtree import experts as ek

# Tokens per expert: empty experts, one token, chunk boundaries (8, 9, 16, 17, 32, 33), odd
# counts, every token on one expert, nothing local at all.
COUNTS = {
    "mixed": [0, 1, 37, 0, 5, 8, 9, 17, 16, 33, 32, 3],
    "one_expert": [0, 0, 70, 0],
    "single_token": [1, 0, 0],
    "none": [0, 0, 0, 0],
}


def grouped_case(counts, K, N, gated, nt, seed, gather, shared=None, grid=None):
    """(got, reference, positions) of one ``grouped_gemm`` call: float64 reference on the host.

    ``gather``: positions read their rows of x through a random ``rowidx`` (tokens repeated,
    as top-k routing does) and the grid has one row per expert with tokens (``active``, as the
    layer launches it, with the fewest rows that hold them); otherwise x holds the positions'
    rows in order and the grid one row per expert. ``shared`` (Ns, Ks,
    tokens): an extra group of that shape over ``tokens`` positions after the routed rows; then
    ``got`` and the reference are flat: the routed rows, then the extra group's first Ns columns.
    ``grid``: ``grouped_gemm``'s grid options (``groups``, ``rows_routed``) over
    those defaults.
    """
    g = torch.Generator().manual_seed(seed)
    E, P = len(counts), sum(counts)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    first = P + 3                              # static rows past offs[-1], left undefined
    Ns, Ks, S = shared if shared is not None else (0, 0, 0)
    rows = first + S
    if gather:
        x = torch.randn(max(P // 2, S, 1), K, generator=g).to(torch.bfloat16)
        rowidx = torch.randint(0, x.shape[0], (first,), generator=g, dtype=torch.int32)
    else:
        x, rowidx = torch.randn(rows, K, generator=g).to(torch.bfloat16), None
    w = (torch.randn(E, N, K, generator=g) * K ** -0.5).to(torch.bfloat16)
    up = (torch.randn(E, N, K, generator=g) * K ** -0.5).to(torch.bfloat16) if gated else None
    ref = ek.reference_grouped(x, w, offs, rowidx, up)
    kw = {}
    if shared is not None:
        sw = (torch.randn(Ns, Ks, generator=g) * Ks ** -0.5).to(torch.bfloat16)
        su = (torch.randn(Ns, Ks, generator=g) * Ks ** -0.5).to(torch.bfloat16) if gated else None
        xs = (x[:S] if gather else x[first:]).double()[:, :Ks]        # token p - first, or row p
        r = xs @ sw.double().T
        if gated:
            r = r / (1 + torch.exp(-r)) * (xs @ su.double().T)
        ref = torch.cat((ref.flatten(), r.flatten()))       # the routed [P, N] and the shared [S, Ns]
        kw = dict(shared=sw.cuda(), shared_up=None if su is None else su.cuda(), shared_first=first)
    if gather:
        nz = [e for e, c in enumerate(counts) if c]
        kw |= dict(active=torch.tensor(nz + [-1] * (E - len(nz)), dtype=torch.int32).cuda(), groups=max(1, len(nz)))
    kw |= grid or {}
    got = ek.grouped_gemm(x.cuda(), w.cuda(), offs.cuda(), rows, up=None if up is None else up.cuda(),
                          rowidx=None if rowidx is None else rowidx.cuda(), nt=nt, **kw)
    got = torch.cat((got[:P].flatten(), got[first:, :Ns].flatten())) if shared is not None else got[:P]
    return got.double().cpu(), ref, P


def grouped_error(got, ref, gated):
    """Largest error relative to the reference's largest magnitude, and the bound it must meet:
    bf16 output (gated) carries one rounding (2^-8 relative); float32 output only the float32
    accumulation over K (a few 2^-24 per term)."""
    scale = float(ref.abs().max()) if ref.numel() else 1.0
    err = float((got - ref).abs().max()) / max(scale, 1e-30) if ref.numel() else 0.0
    return err, (2.0 ** -8 if gated else 1e-5)

"""GPU suite for the tree kernels: bit-identical to the references, graph capture, sanitizers."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kdtree
from kdtree.tree import _launch_build, accept_reference, build_tree_reference, compact_kv_reference
from tree_cases import GUARD_CASES, GUARD_S, guard_batch, sorted_logprobs

pytestmark = pytest.mark.gpu
FIELDS = ("tokens", "parents", "depth", "num_nodes", "visibility")


def assert_same_tree(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert torch.equal(x.cpu(), y.cpu()), f"{f} differs"


@pytest.mark.parametrize("kind", ["random", "ties", "equal_rows", "constant"])
@pytest.mark.parametrize("B,L,K,budget", [
    (1, 1, 1, 1), (3, 15, 16, 64), (4, 15, 512, 512), (2, 32, 1024, 1024), (5, 2, 3, 100),
    (3, 7, 5, 333), (2, 15, 32, 128), (1, 1, 1024, 1024), (2, 32, 1, 40), (7, 4, 2, 7),
])
def test_build_tree_bit_identical(kind, B, L, K, budget, gen):
    lp, tok = sorted_logprobs(B, L, K, gen, kind)
    roots = torch.randint(0, 1000, (B,), generator=gen)
    ref = build_tree_reference(lp, tok, budget, roots)
    got = kdtree.build_tree(lp.cuda(), tok.cuda(), budget, roots.cuda())
    assert_same_tree(got, ref)


@pytest.mark.parametrize("B,L,K,budget", [(6, 15, 32, 32), (4, 15, 512, 512), (3, 32, 64, 1024), (5, 3, 7, 200)])
def test_build_tree_parallel_and_serial_paths(B, L, K, budget, gen):
    """Both kernel paths equal the reference; continuous inputs take the parallel path (the
    heap fallback is not what the first test is exercising), and the serial launch the heap."""
    lp, tok = sorted_logprobs(B, L, K, gen)
    ref = build_tree_reference(lp, tok, budget)
    for serial, want in ((False, 0), (True, 3)):
        path = torch.full((B,), -1, dtype=torch.int32, device="cuda")
        assert_same_tree(_launch_build(lp.cuda(), tok.cuda(), budget, serial=serial, path=path), ref)
        assert path.tolist() == [want] * B, path.tolist()


def test_build_tree_mixed_batch_paths(gen):
    """One launch where some sequences fall back to the heap (ties straddling every threshold,
    a positive log-prob) and the others take the parallel path."""
    lp, tok = sorted_logprobs(4, 15, 64, gen)
    lp[1] = -0.75                              # constant rows: no threshold separates the ties
    lp[2, :, 0] = 0.5                          # a positive log-prob: outside the parallel path
    ref = build_tree_reference(lp, tok, 256)
    path = torch.full((4,), -1, dtype=torch.int32, device="cuda")
    assert_same_tree(_launch_build(lp.cuda(), tok.cuda(), 256, path=path), ref)
    assert path.tolist() == [0, 2, 1, 0], path.tolist()


@pytest.mark.parametrize("budget", [16, 64, 512])
def test_build_tree_from_topk_logprobs(budget, gen):
    """Drafter-like inputs (top-K of a peaky log-softmax, in float32 and through bf16 logits,
    which repeat values): bit-identical, and the continuous ones on the parallel path."""
    logits = torch.randn(8, 15, 32000, generator=gen) * 3.0
    for dtype, parallel in ((torch.float32, True), (torch.bfloat16, False)):
        lp, tok = kdtree.topk_logprobs(logits.to(dtype).float().cuda(), budget)
        path = torch.full((8,), -1, dtype=torch.int32, device="cuda")
        got = _launch_build(lp, tok, budget, path=path)
        assert_same_tree(got, build_tree_reference(lp.cpu(), tok.cpu(), budget))
        if parallel:
            assert path.tolist() == [0] * 8, path.tolist()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_build_tree_extreme_magnitudes(dtype, gen):
    # float64 rounding matters here: tiny and huge log-probs in one row
    lp = torch.cat([-torch.rand(2, 10, 8, generator=gen) * 1e-7,
                    -torch.rand(2, 10, 8, generator=gen) * 60.0], -1).sort(-1, descending=True).values
    tok = torch.randint(0, 1 << 20, (2, 10, 16), generator=gen, dtype=dtype)
    assert_same_tree(kdtree.build_tree(lp.cuda(), tok.cuda(), 300), build_tree_reference(lp, tok, 300))


def test_build_tree_under_graph_capture(gen):
    lp, tok = sorted_logprobs(8, 15, 64, gen)
    lp_d, tok_d = lp.cuda(), tok.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kdtree.build_tree(lp_d, tok_d, 64, validate=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tree = kdtree.build_tree(lp_d, tok_d, 64, validate=False)
    lp2, tok2 = sorted_logprobs(8, 15, 64, gen, "ties")
    lp_d.copy_(lp2), tok_d.copy_(tok2)  # replay on new inputs
    g.replay()
    torch.cuda.synchronize()
    assert_same_tree(tree, build_tree_reference(lp2, tok2, 64))


def random_target(tree, gen, p_agree=0.8):
    """Target choices that agree with a random child most of the time."""
    B, N = tree.tokens.shape
    tok, par = tree.tokens.cpu(), tree.parents.cpu()
    target = torch.randint(0, 50000, (B, N), generator=gen)
    for b in range(B):
        for j in range(int(tree.num_nodes[b]) - 1, 0, -1):
            if torch.rand(1, generator=gen).item() < p_agree:
                target[b, par[b, j]] = tok[b, j]
    return target


@pytest.mark.parametrize("B,L,K,budget", [(16, 15, 8, 64), (4, 15, 512, 512), (3, 32, 2, 1024), (2, 1, 1, 1)])
def test_accept_and_compact_match_reference(B, L, K, budget, gen):
    lp, tok = sorted_logprobs(B, L, K, gen)
    tree = kdtree.build_tree(lp.cuda(), tok.cuda(), budget)
    target = random_target(tree, gen)
    ref = accept_reference(tree, target)
    got = kdtree.accept_tree(tree, target.cuda())
    for f in ("indices", "length", "bonus"):
        assert torch.equal(getattr(got, f).cpu(), getattr(ref, f).cpu()), f
    N = budget + 1
    prefix = torch.randint(0, 50, (B,), generator=gen)
    for shape, dtype in (((B, 60 + N, 576), torch.bfloat16), ((3, B, 60 + N, 70), torch.float32),
                         ((B, 60 + N, 3), torch.float16)):
        kv = torch.randn(shape, generator=gen).to(dtype)
        want = kv.clone()
        compact_kv_reference(want, prefix, ref)
        kv_d = kv.cuda()
        kdtree.compact_kv(kv_d, prefix.cuda(), got)
        assert torch.equal(kv_d.cpu(), want), (shape, dtype)


def test_accept_root_only_and_full_depth_on_gpu():
    L = 6
    parents = torch.arange(-1, L, dtype=torch.int32).expand(2, L + 1).contiguous()
    tokens = torch.arange(L + 1, dtype=torch.int32).expand(2, L + 1).contiguous()
    tree = kdtree.Tree.from_parents(parents.cuda(), tokens.cuda(), draft_depth=L)
    target = torch.stack([torch.arange(1, L + 2), torch.full((L + 1,), 10**6)]).cuda()
    acc = kdtree.accept_tree(tree, target)
    assert acc.length.tolist() == [L + 1, 1] and acc.bonus.tolist() == [L + 1, 10**6]


def test_accept_and_compact_capture_in_one_graph(gen):
    lp, tok = sorted_logprobs(8, 15, 32, gen)
    tree = kdtree.build_tree(lp.cuda(), tok.cuda(), 32)
    target = random_target(tree, gen).cuda()
    kv = torch.randn(8, 200, 576, generator=gen).to(torch.bfloat16).cuda()
    prefix = torch.randint(0, 100, (8,), generator=gen).cuda()
    want = kv.clone()
    compact_kv_reference(want, prefix, accept_reference(tree, target))
    g = torch.cuda.CUDAGraph()
    work = kv.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up compiles the kernels outside the capture
        kdtree.compact_kv(work, prefix, kdtree.accept_tree(tree, target), validate=False)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        acc = kdtree.accept_tree(tree, target)
        kdtree.compact_kv(work, prefix, acc, validate=False)
    work.copy_(kv)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(work, want)


@pytest.mark.parametrize("case", list(GUARD_CASES))
@pytest.mark.parametrize("dtype,D", [(torch.bfloat16, 576), (torch.float32, 7)])
def test_compact_kernel_never_writes_outside_a_sequence(case, dtype, D, gen):
    """validate=False hands an inconsistent Accepted to the kernel: the bad sequence (1, between
    two good ones) is left whole, the good ones are compacted, no row of the cache beyond them
    (nor the guard rows around the cache) changes."""
    B, S, layers = 3, GUARD_S, 2
    idx, length, prefix = guard_batch(case)
    acc = kdtree.Accepted(idx, length, torch.zeros(3, dtype=torch.int32))
    # the cache sits inside a larger buffer, so writes past its ends would show in the guard rows
    buf = torch.randn(layers, B, S + 16, D, generator=gen).to(dtype).cuda()
    kv = buf[:, :, 8:8 + S]
    before = buf.clone()
    acc_d = kdtree.Accepted(acc.indices.cuda(), acc.length.cuda(), acc.bonus.cuda())
    kdtree.compact_kv(kv, prefix.cuda(), acc_d, validate=False)
    torch.cuda.synchronize()
    want = before.clone()
    compact_kv_reference(want[:, :, 8:8 + S], prefix, acc)  # skips sequence 1 the same way
    assert torch.equal(buf[:, 1], before[:, 1]), "the inconsistent sequence was written"
    assert torch.equal(buf[:, :, :8], before[:, :, :8]) and torch.equal(buf[:, :, 8 + S:], before[:, :, 8 + S:])
    assert torch.equal(buf, want)
    with pytest.raises(ValueError, match="^(accepted|prefix_lens)"):  # the same input, validated
        kdtree.compact_kv(kv, prefix.cuda(), acc_d)
    assert torch.equal(buf, want)


def test_ops_refuse_out_of_range_tokens_on_gpu(gen):
    """The value checks run on CUDA tensors too, before any launch."""
    lp, tok = sorted_logprobs(2, 3, 4, gen)
    tok[1, 1, 1] = 2**32 - 1
    with pytest.raises(ValueError, match="^tokens: token ids"):
        kdtree.build_tree(lp.cuda(), tok.cuda(), 8)
    tree = kdtree.build_tree(lp.cuda(), tok.cuda().clamp(max=1000), 8)
    with pytest.raises(ValueError, match="^target_tokens: token ids"):
        kdtree.accept_tree(tree, torch.full((2, 9), 2**31, device="cuda"))


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_tree_kernels_under_compute_sanitizer(tool):
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(exe):
        pytest.skip("compute-sanitizer not installed")
    script = Path(__file__).with_name("sanitize_tree.py")
    res = subprocess.run([exe, "--tool", tool, sys.executable, str(script)], capture_output=True,
                         text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    summary = "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" if tool == "racecheck" \
        else "ERROR SUMMARY: 0 errors"
    assert summary in out, out[-3000:]
    assert "selfcheck ok" in out

"""Small run of every tree kernel, for compute-sanitizer (see test_tree_gpu.py)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import kdtree  # noqa: E402
from kdtree.tree import _launch_build, build_tree_reference  # noqa: E402
from tree_cases import GUARD_CASES, GUARD_S, guard_batch, sorted_logprobs  # noqa: E402

g = torch.Generator().manual_seed(0)
for kind, (B, L, K, budget) in (("random", (3, 15, 16, 70)), ("ties", (2, 5, 4, 130))):
    lp, tok = sorted_logprobs(B, L, K, g, kind)
    tree = kdtree.build_tree(lp.cuda(), tok.cuda(), budget)  # random: parallel path; ties: heap
    ref = build_tree_reference(lp, tok, budget).visibility
    assert torch.equal(tree.visibility.cpu(), ref)
    assert torch.equal(_launch_build(lp.cuda(), tok.cuda(), budget, serial=True).visibility.cpu(), ref)
    target = torch.randint(0, 3, (B, budget + 1)).cuda()
    acc = kdtree.accept_tree(tree, target)
    kv = torch.randn(B, 40 + budget + 1, 576).to(torch.bfloat16).cuda()
    kdtree.compact_kv(kv, torch.arange(B).cuda() * 7, acc)
# Inconsistent Accepted rows, unvalidated: the compaction kernel's bounds guard, in an exact-size cache
for case in GUARD_CASES:
    idx, length, prefix = guard_batch(case)
    kv = torch.randn(3, GUARD_S, 576).to(torch.bfloat16).cuda()
    kdtree.compact_kv(kv, prefix.cuda(), kdtree.Accepted(idx.cuda(), length.cuda(), length.cuda()), validate=False)
torch.cuda.synchronize()
print("selfcheck ok")

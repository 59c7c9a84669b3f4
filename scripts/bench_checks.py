"""Host cost of the ops' argument checks (no GPU needed): accept_tree's and build_tree's checks
on CPU tensors, best of 5 x 20000 calls, for the kdtree package found under ROOT (a checkout or
an unpacked older commit, to compare).

    python scripts/bench_checks.py ROOT
"""
import sys
import timeit

import torch

sys.path.insert(0, sys.argv[1])
import kdtree
from kdtree.tree import _check_tree, Tree, _check_build_args
from kdtree.checks import check_tensor
assert kdtree.__file__.startswith(sys.argv[1]), kdtree.__file__
i32 = torch.int32
tree = Tree(torch.zeros(8, 65, dtype=i32), torch.zeros(8, 65, dtype=i32), torch.zeros(8, 65, dtype=i32),
            torch.full((8,), 65, dtype=i32), torch.zeros(8, 65, 2, dtype=torch.int64), 15)
target = torch.zeros(8, 65, dtype=torch.int64)
lp = torch.zeros(8, 15, 64)
tok = torch.zeros(8, 15, 64, dtype=torch.int64)


def accept_checks():
    _check_tree(tree); check_tensor("target_tokens", target, (torch.int32, torch.int64), 2)


def build_checks():
    _check_build_args(lp, tok, 64, None, False)


n = 20000
for name, f in (("accept checks", accept_checks), ("build checks", build_checks)):
    best = min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6
    print(f"{sys.argv[1]:12s} {name}: {best:.2f} us")

import pytest
import torch

from kdtree.kernels import cuda_available


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where there is no CUDA device (or no CuPy)."""
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A fresh, seeded-from-entropy generator per test: fresh random inputs every run."""
    g = torch.Generator()
    seed = torch.seed()
    g.manual_seed(seed)
    print(f"seed={seed}")
    return g

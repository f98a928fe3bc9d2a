import pytest
import torch

import studylog  # noqa: F401  (selects the interpreter before any kernel module is imported)

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `make test-gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh generator with a random seed (printed on failure), so every run draws new inputs."""
    seed = torch.seed() % (2**31)
    gen = torch.Generator().manual_seed(seed)
    gen.seed_value = seed
    return gen

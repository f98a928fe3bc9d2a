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


class SeededGenerator(torch.Generator):
    """A CPU generator that remembers its seed, so a failing draw can be replayed."""

    seed_value: int


@pytest.fixture
def rng(record_property):
    """A fresh generator with a random seed (recorded in the test report), so every run draws new inputs."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(torch.seed())).item())
    gen = SeededGenerator()
    gen.manual_seed(seed)
    gen.seed_value = seed
    record_property("seed", seed)
    print(f"rng seed: {seed}")  # shown with the output of a failing test
    return gen

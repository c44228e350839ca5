import os
from pathlib import Path

# tests never touch a hub or the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


TIERS = ("unit", "dist", "integration", "gpu", "slurm")  # tests/<tier>/: each test carries its folder's marker


def tier_of(path: Path) -> str | None:
    """The tier folder `path` sits in (tests/<tier>/...), or None outside them."""
    rel = path.resolve().relative_to(Path(__file__).resolve().parent) if path.is_absolute() else path
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the folder's marker must already be there
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier is not None and item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in keywords`: a checkout dir named gpu matches that
            item.add_marker(skip)

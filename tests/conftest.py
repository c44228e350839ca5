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
OPT_IN = "DECENTRAIN_SLOW_TESTS"  # runs the `optin` tests too (the README's command leaves them out)

# pytest-xdist (`-n 2 --dist loadgroup` in pyproject): tests of one group run on one worker, one after
# another. Groups for what two workers must not do at once: share one host-wide resource, or start two
# 4-rank jobs together on 2 cores (each alone is fine; two double the time of both).
XDIST_GROUPS = {
    "tests/integration/test_wan_emulation.py": "netns",  # one namespace prefix for the host
    "tests/slurm/": "slurm",  # one local cluster
    "tests/integration/test_zero_replicas_recipe.py": "four_ranks",  # DeepSpeed's JIT op build: one at a time
    "tests/integration/test_transports_agree.py": "four_ranks",
    "tests/integration/test_fsdp2_replicas.py": "four_ranks",
    "tests/integration/test_noloco_heal.py": "four_ranks",
    "tests/integration/test_noloco_survives.py": "four_ranks",
    "tests/integration/test_hdee_noloco_lane.py": "four_ranks",
    "tests/dist/test_gossip_membership.py": "four_ranks",
    "tests/integration/test_train_recipe.py::test_resume_on_four_ranks": "four_ranks",
}
# modules whose module-scoped fixture is a run of its own (a SAPO run, a pytest collection, a model):
# one worker takes the whole module, so the fixture runs once, not once per worker
XDIST_GROUPS.update(
    {
        m: m
        for m in (
            "tests/unit/test_collection.py",
            "tests/unit/test_sapo_node.py",
            "tests/unit/test_sapo_generation.py",
            "tests/unit/test_sapo_fast_generation.py",
            "tests/unit/test_dei_pmars.py",
        )
    }
)


def pytest_configure(config):
    # DeepSpeed JIT-builds its CPU comm op on the first initialize (~40 s on 2 cores) into TORCH_EXTENSIONS_DIR.
    # One cache for the whole session and the next ones (the engine's default, made explicit here so every
    # recipe subprocess and xdist worker shares it): the build is paid once per machine, not per process.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "decentrain" / "torch_extensions"))


def tier_of(path: Path) -> str | None:
    """The tier folder `path` sits in (tests/<tier>/...), or None outside them."""
    rel = path.resolve().relative_to(Path(__file__).resolve().parent) if path.is_absolute() else path
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in TIERS else None


def _rel(item) -> str:
    """The test's node id from the checkout root (tests/...), whatever directory pytest was started in."""
    root = Path(__file__).resolve().parent.parent
    path = Path(str(item.path)).resolve()
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
    return rel + item.nodeid[len(item.nodeid.split("::")[0]) :]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the folder's marker must already be there
def pytest_collection_modifyitems(config, items):
    optin = pytest.mark.skip(reason=f"opt-in: {OPT_IN}=1")
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier is not None and item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("optin") is not None and os.environ.get(OPT_IN) != "1":
            item.add_marker(optin)
        group = next((g for prefix, g in XDIST_GROUPS.items() if _rel(item).startswith(prefix)), None)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in keywords`: a checkout dir named gpu matches that
            item.add_marker(skip)

"""Config checks for `launcher.fault_tolerance=torchft`, run before any worker starts."""

from __future__ import annotations

from decentrain.algorithms.pretraining.torchft.manager import FT_ALGORITHMS, torchft_available


def check_fault_tolerant_run(cfg, world_size: int) -> None:
    """ValueError (one line, naming the field) for a run torchft cannot carry. `cfg` is a TrainConfig."""
    if cfg.launcher.fault_tolerance != "torchft":
        return
    if not torchft_available():
        raise ValueError("launcher.fault_tolerance=torchft needs torchft: pip install 'decentrain[ft]'")
    name = cfg.algorithm.name
    if name not in FT_ALGORITHMS:
        raise ValueError(f"launcher.fault_tolerance=torchft does not support algorithm.name={name!r}; "
                         f"allowed: {FT_ALGORITHMS.names()} (noloco survives a dead peer on its own)")
    if cfg.engine.name != "torch":
        raise ValueError(f"engine.name={cfg.engine.name!r} with launcher.fault_tolerance=torchft; allowed: torch")
    if name == "ddp":
        return
    if world_size != 1:  # each rank of a group would be its own un-synced DiLoCo replica
        raise ValueError(f"launcher.nproc_per_node={world_size} with launcher.fault_tolerance=torchft and "
                         f"algorithm={name}: allowed 1 (one rank per replica group; launcher.replicas sets how many)")
    algo = cfg.algorithm
    if getattr(algo, "adaptive_inner_steps", False):
        raise ValueError("algorithm.adaptive_inner_steps=true with launcher.fault_tolerance=torchft; allowed: false")
    if getattr(algo, "overlap", False):  # torchft's DiLoCo has its own schedule (streaming's overlap_steps)
        raise ValueError("algorithm.overlap=true with launcher.fault_tolerance=torchft; allowed: false "
                         "(or algorithm=streaming_diloco with overlap_steps)")
    if name == "streaming_diloco":
        h, p, tau = algo.inner_steps, algo.num_fragments, algo.overlap_steps
        if h % p:
            raise ValueError(f"algorithm.inner_steps={h} must be a multiple of algorithm.num_fragments={p} with torchft")
        if tau >= h // p:
            raise ValueError(f"algorithm.overlap_steps={tau} must be < inner_steps/num_fragments={h // p} with torchft")
        if algo.quantization != "none":
            raise ValueError(f"algorithm.quantization={algo.quantization!r} with launcher.fault_tolerance=torchft; allowed: none")

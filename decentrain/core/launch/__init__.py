"""Starting workers: the launcher and its config, torchft launch, Slurm sweeps, incarnations."""

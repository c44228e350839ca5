"""Starting workers: the launcher and its config, Slurm sweeps. Above core/comm (the launcher claims each
worker's incarnation there and reaches the job store through it); nothing in core/comm imports this package."""

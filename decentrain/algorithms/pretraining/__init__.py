"""The shared pre-training loop and what runs it: config, trainer, the job path (run.py), the inner/outer
algorithm base, replicas, precision and compile, engines, transports and torchft."""

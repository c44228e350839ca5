"""Hydra's submitit Slurm launcher, asking Slurm first whether the sweep's request can run.

`conf/hydra/launcher/slurm.yaml` selects it. Hydra accepts launchers only from this package.
"""

from __future__ import annotations

import logging
from typing import Sequence

from hydra.core.utils import JobReturn

from decentrain.core.launch.slurm_sweep import check_schedulable

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:  # the `slurm` extra is not installed: no launcher here, and no Hydra warning on every run
    SlurmLauncher = None

log = logging.getLogger(__name__)

if SlurmLauncher is not None:

    class CheckedSlurmLauncher(SlurmLauncher):
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            log.info("Slurm accepts the request: %s", check_schedulable(self.params))
            return super().launch(job_overrides, initial_job_idx)

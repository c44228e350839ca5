"""Slurm's task environment (under submitit) as a World's launch env, and the sweep's sbatch check."""

import pytest

from decentrain.core.world import first_host, is_submitit_slurm_task, read_launch_env, slurm_launch_env, tasks_per_node

TASK = {
    "SUBMITIT_EXECUTOR": "slurm",
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "cpu[07-08]",
    "SLURM_JOB_NODELIST": "cpu[07-08]",
}


@pytest.mark.parametrize(
    "nodelist,first",
    [
        ("cpu1", "cpu1"),
        ("cpu1,gpu2", "cpu1"),
        ("gpu[07-09,12]", "gpu07"),
        ("gpu[3,5]-ib,cpu1", "gpu3-ib"),
        ("a1,b[1-2]", "a1"),
    ],
)
def test_first_host(nodelist, first):
    assert first_host(nodelist) == first


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]


def test_slurm_task_is_a_rank():
    env = slurm_launch_env(TASK)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.run_id, env.agent_store) == (
        "cpu07",
        20000 + 4242,
        "slurm-4242",
        False,
    )
    assert env.under_torchrun and env.slurm_task
    assert slurm_launch_env({**TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}).master_addr == "10.0.0.1"


def test_only_multi_task_submitit_jobs_are_read(monkeypatch):
    assert is_submitit_slurm_task(TASK)
    assert not is_submitit_slurm_task({**TASK, "SUBMITIT_EXECUTOR": "local"})  # sbatch script / srun: torchrun's env
    assert not is_submitit_slurm_task({**TASK, "SLURM_NTASKS": "1"})  # one task: the recipe may start local workers
    for k, v in TASK.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RANK", raising=False)
    assert read_launch_env().rank == 3
    monkeypatch.setenv("RANK", "0")  # torchrun inside the job wins
    assert read_launch_env().rank == 0 and not read_launch_env().slurm_task


def test_sbatch_test_args():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from decentrain.core.launch.slurm_sweep import sbatch_test_args

    args = sbatch_test_args(
        {
            "nodes": 2,
            "tasks_per_node": 2,
            "cpus_per_task": 1,
            "gpus_per_node": None,
            "mem_gb": 4,
            "timeout_min": 60,
            "partition": None,
            "additional_parameters": {"reservation": "r1"},
        }
    )
    assert args == [
        "--nodes=2",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--time=60",
        "--mem=4G",
        "--reservation=r1",
    ]

"""The launch scripts in launch/: valid bash, the documented srun lines, and environments that pass
``zerotopo env --check``'s warnings."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from test_discovery import FRONTIER_RANK9

from zerotopo.launch import discover, warnings_for

LAUNCH = Path(__file__).parent.parent.parent / "launch"
SCRIPTS = ["frontier.sbatch", "slurm-nvidia.sbatch", "mpiexec.sh", "local.sh"]


def dry_run(script: str, args: list[str], env: dict[str, str]) -> tuple[list[list[str]], dict[str, str]]:
    """Source ``script`` with ZEROTOPO_DRY_RUN=1: the commands it would run and the environment it exports."""
    shell = f"source {shlex.quote(str(LAUNCH / script))} {shlex.join(args)} && echo '--ENV--' && env"
    base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "USER": "u", "ZEROTOPO_DRY_RUN": "1", **env}
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=base, timeout=30)
    assert proc.returncode == 0, proc.stderr
    commands, _, env_text = proc.stdout.partition("--ENV--\n")
    exported = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    return [shlex.split(line) for line in commands.splitlines()], exported


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(LAUNCH / script)], check=True)


def test_frontier_sbatch():
    commands, env = dry_run(
        "frontier.sbatch",
        ["configs/big.yml", "--set", "train_iters=5"],
        {"SLURM_NNODES": "2", "SLURM_JOB_ID": "1843217"},
    )
    srun = ["srun", "-N", "2", "-n", "16", "-c", "7", "--gpus-per-task=1", "--gpu-bind=closest"]
    cache = env["MIOPEN_USER_DB_PATH"]
    assert re.fullmatch(r"/tmp/u-miopen-1843217-[A-Za-z0-9]{10}", cache)
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == cache
    mkdir = ["srun", "-N", "2", "--ntasks-per-node=1", "bash", "-c"]
    assert commands[0][: len(mkdir)] == mkdir and commands[0][-2:] == ["miopen-dir", cache]
    assert commands[1:] == [
        [*srun, "zerotopo", "env", "--check", "--topology", "frontier", "--nodes", "2"],
        [*srun, "zerotopo", "train", "--topology", "frontier", "configs/big.yml", "--set", "train_iters=5"],
    ]


def test_frontier_cache_dir_is_private(tmp_path):
    """The per-node command creates a fresh 700 directory and refuses a path someone created first."""
    commands, env = dry_run("frontier.sbatch", ["c.yml"], {"SLURM_NNODES": "1", "SLURM_JOB_ID": "7"})
    script = commands[0][commands[0].index("-c") + 1]
    fresh = tmp_path / "fresh"
    assert subprocess.run(["bash", "-c", script, "miopen-dir", str(fresh)]).returncode == 0
    assert fresh.is_dir() and (fresh.stat().st_mode & 0o777) == 0o700
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path)
    assert (
        subprocess.run(
            ["bash", "-c", script, "miopen-dir", str(planted)], stderr=subprocess.DEVNULL
        ).returncode
        != 0
    )
    taken = tmp_path / "taken"
    taken.mkdir()
    assert (
        subprocess.run(["bash", "-c", script, "miopen-dir", str(taken)], stderr=subprocess.DEVNULL).returncode
        != 0
    )
    # What srun adds per rank, on top of what the script exports: no warning applies.
    rank_env = {
        **env,
        **{k: v for k, v in FRONTIER_RANK9.items() if k.startswith(("SLURM", "ROCR"))},
        "HOSTNAME": "frontier08813",
        "SLURM_JOB_ID": "1843217",
    }
    info = discover(rank_env, device_kind="rocm", hostname="frontier08813")
    assert warnings_for(info, rank_env) == []
    # Without the script's settings the same rank is warned about.
    assert (
        len(warnings_for(info, {k: v for k, v in rank_env.items() if not k.startswith(("FI_", "NCCL_"))}))
        == 1
    )


def test_slurm_nvidia_sbatch():
    commands, env = dry_run(
        "slurm-nvidia.sbatch",
        ["c.yml"],
        {"SLURM_NNODES": "4", "SLURM_CPUS_PER_TASK": "12", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    )
    srun = ["srun", "-N", "4", "-n", "32", "--ntasks-per-node=8", "--cpu-bind=cores"]
    assert commands[-1] == [*srun, "zerotopo", "train", "c.yml"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env and env["OMP_NUM_THREADS"] == "12"
    rank_env = {
        **env,
        "SLURM_JOB_ID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "11",
        "SLURM_LOCALID": "3",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "32",
        "SLURM_NNODES": "4",
        "SLURM_TASKS_PER_NODE": "8(x4)",
        "SLURM_NODELIST": "dgx[01-04]",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    info = discover(rank_env, device_kind="cuda", hostname="dgx02")
    assert (info.physical_device, warnings_for(info, rank_env)) == (3, [])


def test_mpiexec_and_local_scripts():
    commands, env = dry_run("mpiexec.sh", ["configs/tiny.yml"], {})
    assert commands == [
        ["mpiexec", "-n", "8", "-ppn", "8", "zerotopo", "train", "--launcher", "auto", "configs/tiny.yml"]
    ]
    assert env["ZEROTOPO_EMULATED_NODES"] == "2"
    commands, env = dry_run("mpiexec.sh", ["c.yml"], {"NP": "16", "PPN": "8", "HOSTS": "a,b"})
    assert commands[0][:7] == ["mpiexec", "-n", "16", "-ppn", "8", "-hosts", "a,b"]
    assert "ZEROTOPO_EMULATED_NODES" not in env
    commands, env = dry_run("local.sh", [], {})
    assert commands == [["zerotopo", "train", "configs/tiny.yml", "--launcher", "local"]]
    assert env["OMP_NUM_THREADS"] == "1"


def test_frontier_sbatch_requeues_a_preempted_run(tmp_path):
    """The ranks' exit status 75 (saved on SIGTERM/SIGUSR1) makes the script requeue the job; any other
    status is passed on without a requeue. Real bash, with srun and scontrol stand-ins on PATH."""
    text = (LAUNCH / "frontier.sbatch").read_text()
    assert "#SBATCH --signal=USR1@" in text and "#SBATCH --requeue" in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nfor a in "$@"; do [[ $a == train ]] && exit "$TRAIN_STATUS"; done\nexit 0\n'
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scontrol.log\n')
    (bin_dir / "hostname").write_text("#!/bin/bash\necho 10.0.0.1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    for status, requeued in ((75, True), (1, False), (0, False)):
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/tmp", "USER": "u", "SLURM_NNODES": "1",
               "SLURM_JOB_ID": "99", "ZEROTOPO_PREFLIGHT": "0", "TRAIN_STATUS": str(status)}  # fmt: skip
        proc = subprocess.run(["bash", str(LAUNCH / "frontier.sbatch"), "c.yml"], env=env, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert proc.returncode == status, proc.stderr
        log = tmp_path / "scontrol.log"
        assert (log.exists() and log.read_text() == "requeue 99\n") == requeued, proc.stderr
        log.unlink(missing_ok=True)

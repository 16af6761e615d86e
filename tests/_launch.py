"""Starting Python subprocesses for the distributed tests: a clean
environment, a free port, and waiting with a deadline."""
import os
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Variables a launcher may have left in this process's environment; every
# subprocess here starts without them and gets only what its case sets.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def clean_env(**variables: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # two shared cores: no thread pools per rank
    env.update(variables)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def finish(processes: list[subprocess.Popen], timeout: float) -> list[str]:
    """Wait for every process; kill what is left if one fails to end in time."""
    try:
        return [process.communicate(timeout=timeout)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

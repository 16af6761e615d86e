"""The README's multi-node section: its code blocks are valid, and its
train.py runs on two ranks under torchrun and under srun's variables."""
import subprocess
import sys

import pytest

from _launch import clean_env, finish, free_port
from _readme import MULTINODE, README_PATH, sections
from _readme import code_blocks as blocks_of

GUIDE = README_PATH


def code_blocks(language):
    return blocks_of(sections()[MULTINODE], language)


def test_guide_code_blocks_are_valid():
    python, shell = code_blocks("python"), code_blocks("bash")
    assert python and shell
    for block in python:
        compile(block, str(GUIDE), "exec")
    for block in shell:
        result = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr


def guide_script(tmp_path, name):
    """The guide's Python block that starts with ``# name``, as a file."""
    script = next(block for block in code_blocks("python") if block.startswith(f"# {name}\n"))
    path = tmp_path / name
    path.write_text(script)
    return path


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_guide_train_script_runs_on_two_ranks(tmp_path, launcher):
    pytest.importorskip("torch", reason="the guide's train.py trains with torch DDP")
    script = guide_script(tmp_path, "train.py")
    if launcher == "torchrun":
        commands = [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc-per-node=2", str(script)]]
        envs = [clean_env(GLOO_SOCKET_IFNAME="lo")]
    else:
        # What srun gives each task: SLURM's numbering and no RANK; the batch
        # script exports MASTER_ADDR and MASTER_PORT.
        port = str(free_port())
        commands = [[sys.executable, str(script)]] * 2
        envs = [clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo")
                for rank in range(2)]
    processes = [subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for command, env in zip(commands, envs)]
    outputs = finish(processes, timeout=120)
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output
    assert "epoch 2: 79 steps on each rank" in "".join(outputs)

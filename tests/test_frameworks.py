"""fastload.torch under the frameworks that shard loaders across ranks, with
the real packages (the frameworks extra): Lightning's Trainer with DDP on 2
CPU processes and accelerate with 2 processes on gloo. Each rank loads a
disjoint share of the dataset, the shares cover it, and fastload's engine
loads them. Skipped, with the reason, where a package is not installed."""
import importlib.util
import json
import subprocess
import sys

import pytest

from _launch import REPO, clean_env, finish, free_port

torch = pytest.importorskip("torch", reason="fastload.torch needs torch installed")

# 2 ranks x batches of 4 x 3 steps: every rank gets whole batches, so no
# framework pads a rank's share with repeated samples.
SAMPLES = 24


def needs(module):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install 'fastload[frameworks]')")


# What a rank reports as its engine: fastload's statistics of the batches
# it loaded (a torch loader has none).
ENGINE = """
def engine(loader):
    stats = getattr(loader, "stats", lambda: None)()
    return "fastload" if stats is not None and stats.batches > 0 else repr(type(loader))
"""


def check_shares(reports):
    shares = [report["indices"] for report in reports]
    assert all(report["engine"] == "fastload" for report in reports), reports
    assert not set(shares[0]) & set(shares[1]), shares
    assert sorted(shares[0] + shares[1]) == list(range(SAMPLES))


ACCELERATE_RANK = """
import json, sys
import numpy as np
from accelerate import Accelerator
import fastload as fl, fastload.torch as flt
%(engine)s
accelerator = Accelerator(cpu=True)
loader = flt.DataLoader(fl.ArrayDataset(np.arange(%(samples)d)), batch_size=4, shuffle=True,
                        num_workers=2)
prepared = flt.use_fastload_engine(accelerator.prepare(loader))
seen = []
for (batch,) in prepared:
    seen += batch.tolist()
print(json.dumps({"indices": seen, "engine": engine(prepared.base_dataloader)}))
"""


@needs("accelerate")
@pytest.mark.timeout(240)
def test_accelerate_with_two_gloo_processes_shards_and_loads_with_fastload():
    port = str(free_port())
    script = ACCELERATE_RANK % {"samples": SAMPLES, "engine": ENGINE}
    ranks = [subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env=clean_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      GLOO_SOCKET_IFNAME="lo", ACCELERATE_USE_CPU="true"))
        for rank in range(2)]
    outputs = finish(ranks, timeout=200)
    for process, output in zip(ranks, outputs):
        assert process.returncode == 0, output
    check_shares([json.loads(output.strip().splitlines()[-1]) for output in outputs])


LIGHTNING_SCRIPT = """
import json, os, sys
import numpy as np
import torch
import lightning as L
import fastload as fl, fastload.torch as flt
%(engine)s
out = sys.argv[1]


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen = []

    def training_step(self, batch, index):
        (x,) = batch
        self.seen += x.tolist()
        return self.layer(x.float()[:, None]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return flt.DataLoader(fl.ArrayDataset(np.arange(%(samples)d)), batch_size=4,
                              shuffle=True, num_workers=2)


model = Model()
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=1,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model)
with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump({"indices": model.seen, "engine": engine(trainer.train_dataloader)}, f)
"""


@needs("lightning")
@pytest.mark.timeout(300)
def test_lightning_ddp_on_two_cpu_processes_shards_and_loads_with_fastload(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING_SCRIPT % {"samples": SAMPLES, "engine": ENGINE})
    # Lightning's DDP launcher starts rank 1 by running this script again.
    trainer = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                                             GLOO_SOCKET_IFNAME="lo"))
    (output,) = finish([trainer], timeout=280)
    assert trainer.returncode == 0, output
    check_shares([json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)])

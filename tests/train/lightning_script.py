"""Run by tests/test_lightning.py as a script: Lightning's "ddp" strategy re-launches this file for rank 1."""

import sys

import lightning.pytorch as pl
import pyro
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.train.lightning import BayesianLightningModule


class SameNoise(pl.Callback):
    """Lightning's DDP launcher re-seeds each rank during set-up; re-seed every run at the start of training so that
    one process and two draw the same weight noise."""

    def on_train_start(self, trainer, module):
        pl.seed_everything(0, verbose=False)


def main(devices: int, out: str, mode: str = "fit") -> None:
    pl.seed_everything(0, verbose=False)
    pyro.clear_param_store()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    y = torch.tanh(x.sum(-1)) + 0.1 * torch.randn(64, generator=g)
    net = torch.nn.Sequential(BayesianLinear(2, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.2))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.05)
    module = BayesianLightningModule(bnn, guide, num_data=64, example_batch=(x[:2], y[:2]), lr=0.02)
    trainer = pl.Trainer(max_epochs=30, accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[SameNoise()])
    # rank r reads points r, r + devices, ...: every step's global batch is the single process's batch of 32
    if mode == "nan":  # a NaN in the data that only rank 1 reads (and the single process at its step 2)
        x = x.clone()
        x[33] = float("nan")
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=devices, rank=trainer.global_rank, shuffle=False)
    trainer.fit(module, DataLoader(dataset, batch_size=32 // devices, sampler=sampler))
    if trainer.global_rank == 0:
        pyro_bbb.save(out, bnn, guide)



if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:])

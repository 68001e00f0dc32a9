"""Actors for tests/test_lightning_breakpoint.py: an unchanged LightningModule fitted by
``Trainer(strategy="ddp")`` in the ranks of an actor mesh (as notebooks/lightning.ipynb
does), importable by the procs by name so a breakpoint binds to this file's lines."""

from __future__ import annotations

import os
import warnings

import lightning as L
import torch
from torch import nn

from monarch_nb.actor import Actor, endpoint


class TinyRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tiny_loader():
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


class FitRank(Actor):
    """One DDP rank: ``fit`` runs a Trainer over the mesh's torch.distributed variables."""

    @endpoint
    def fit(self, max_steps: int) -> int:
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message=".*(srun|LeafSpec|does not have many workers).*")
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=local,
                            num_nodes=int(os.environ["WORLD_SIZE"]) // local, max_steps=max_steps,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(TinyRegressor(), tiny_loader())
        return trainer.global_step

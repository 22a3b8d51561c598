"""``BayesianLightningModule``: a PyTorch Lightning module that trains a pyro_bbb model and guide (``pip install
pyro-bbb[lightning]``).

Each step computes :class:`pyro_bbb.ELBO` on the batch (likelihood scaled by ``num_data / batch``, KL once) and
returns it to Lightning, which owns the optimizer, devices and strategy. Under ``Trainer(strategy="ddp")``
Lightning's ``DistributedSampler`` gives every rank an equal share and DDP averages the ranks' gradients, which is
exactly the gradient of ``N / G * NLL(global batch) + KL`` (the per-rank losses are ``N / b * NLL_r + KL`` and
``b = G / ranks``). Logs ``nll``, ``kl`` and ``kl_weight`` every step. Trains with torch's Adam, or with a pyro_bbb
optimizer (``optimizer=pyro_bbb.optim.IVON(guide, num_data=N)`` for natural-gradient learning), which Lightning
steps like its own and checkpoints by parameter name.

Examples
--------
>>> import lightning.pytorch as pl
>>> from torch.utils.data import DataLoader, TensorDataset
>>> pyro.clear_param_store()
>>> x, y = torch.randn(64, 3), torch.randn(64)
>>> bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
>>> module = BayesianLightningModule(bnn, pyro_bbb.MeanFieldGuide(bnn), num_data=64, example_batch=(x[:2], y[:2]),
...                                  lr=1e-2)
>>> trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
...                      enable_progress_bar=False, enable_model_summary=False)
>>> trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
>>> module.elbo.step
8
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pyro.optim import PyroOptim

from .._checks import is_set_up
from .._inputs import num_rows
from .._internals import set_up_autoguide
from ..infer.elbo import ELBO
from ..infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight
from ..optim import IVON
from ..optim import Adam as JointAdam
from .distributed import raise_if_any_rank_failed
from .step import TrainingStep, default_adam_rate

try:
    import lightning.pytorch as pl
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("pyro_bbb.train.lightning needs PyTorch Lightning: pip install 'pyro-bbb[lightning]'") from error


__all__ = ["BayesianLightningModule"]


class BayesianLightningModule(pl.LightningModule):
    """Train ``model`` (e.g. :class:`pyro_bbb.BNN`) and ``guide`` (:class:`pyro_bbb.MeanFieldGuide`) with Lightning.

    Parameters
    ----------
    model, guide :
        The Pyro model and guide; their parameters (the guide's means and scales, the model's deterministic layers)
        become this module's parameters.
    num_data : int
        Size of the training set (all ranks together).
    example_batch : (x, y), optional
        A batch to create the guide's parameters before the optimizer is built; not needed when the guide has
        already seen the model.
    lr : float, optional
        The default Adam's learning rate, 1e-3; an ``optimizer`` brings its own (giving both is an error).
    kl_weight : float or schedule
        As in :class:`pyro_bbb.ELBO`; the schedule's step advances once per training step. ``fit``'s
        ``kl_weight="auto"`` is not available here: choose the weight with ``fit`` on a subset and pass it.
    estimator : str
        ``"reparam"``, ``"flipout"`` or ``"local_reparam"`` (see :mod:`pyro_bbb.infer.estimators`).
    num_particles : int
        Weight draws per step.
    optimizer : pyro.optim.PyroOptim, optional
        A pyro_bbb optimizer to train with instead of ``torch.optim.Adam(lr=lr)``: :class:`pyro_bbb.optim.IVON` (built
        for this guide and ``num_data``; it needs the KL weight its ``ess`` sets, ``kl_weight = num_data / ess`` (1
        by default; no schedule), and no ``Trainer(gradient_clip_val=...)``, checked before the first step) or
        :class:`pyro_bbb.optim.Adam`.

    Examples
    --------
    See the module example; ``Trainer(accelerator="gpu", devices=4, strategy="ddp")`` scales it out, and
    ``BayesianLightningModule(bnn, guide, num_data=64, optimizer=pyro_bbb.optim.IVON(guide, num_data=64))`` trains
    by natural gradients.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        guide: torch.nn.Module,
        num_data: int,
        example_batch: tuple[torch.Tensor, torch.Tensor] | None = None,
        lr: float | None = None,
        kl_weight: float | Callable[[int], float] = 1.0,
        estimator: str = "reparam",
        num_particles: int = 1,
        optimizer: PyroOptim | None = None,
    ):
        super().__init__()
        if optimizer is not None and not isinstance(optimizer, PyroOptim):
            raise TypeError(
                f"`optimizer` must be a pyro_bbb optimizer such as pyro_bbb.optim.IVON(guide, num_data) or "
                f"pyro_bbb.optim.Adam(lr=...), got {type(optimizer).__name__}; for a torch optimizer, subclass and "
                "override configure_optimizers."
            )
        lr = default_adam_rate(lr, optimizer, "the module's")
        self.pyro_optimizer = optimizer
        self.model, self.guide = model, guide
        # the step's parts checked together (IVON: this guide, N and kl_weight = N / ess); Lightning runs backward and
        # steps
        self.pyro_step = TrainingStep(model, guide, optimizer or JointAdam(lr=lr), num_data=num_data,
                                      kl_weight=kl_weight, num_particles=num_particles, estimator=estimator)
        self.lr = lr
        # (each training step records its KL weight on the guide when Lightning's backward of pyro_bbb.ELBO's
        # differentiable_loss runs)
        if not is_set_up(guide):
            if example_batch is None:
                raise ValueError(
                    "the guide has no parameters yet: pass example_batch=(x, y) (a small batch of training data) so "
                    "that they exist before Lightning builds the optimizer."
                )
            set_up_autoguide(guide, *example_batch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        error, loss = None, None
        try:
            loss = self.pyro_step.differentiable_loss(x, y)
            if not bool(torch.isfinite(loss)):
                raise FloatingPointError(
                    f"the loss became {float(loss)} at step {self.elbo.step}; lower the learning rate, clip "
                    "gradients (Trainer(gradient_clip_val=...)), or check the data for NaN and extreme values."
                )
        except (ValueError, TypeError, FloatingPointError) as caught:
            error = caught
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise_if_any_rank_failed(error)  # every rank stops together, with the failing rank's message
        elif error is not None:
            raise error
        terms = self.elbo.last_terms
        self.log_dict({"nll": terms["nll"], "kl": terms["kl"], "kl_weight": terms["kl_weight"]},
                      on_step=True, on_epoch=True, batch_size=num_rows(x), sync_dist=True)
        return loss

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's checkpoint also keeps the objective's step count (where a KL schedule is) and the KL weight the
        posterior was trained at (:mod:`pyro_bbb.infer.tempering`): a resumed run trains on at the schedule's weight
        of its step, where it restarted the schedule from step 0."""
        choice = kl_weight_of(self.guide)
        checkpoint["pyro_bbb"] = {"elbo_step": self.pyro_step.schedule_step,
                                  "kl_weight_choice": None if choice is None else choice.to_dict()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Give back what :meth:`on_save_checkpoint` kept (nothing, for a checkpoint written before it kept it)."""
        state = checkpoint.get("pyro_bbb")
        if not isinstance(state, dict):
            return
        choice = state.get("kl_weight_choice")
        choice = None if choice is None else KLWeightChoice.from_dict(choice)  # (checked before anything changes)
        self.pyro_step.schedule_step = int(state["elbo_step"])
        if choice is not None:
            record_kl_weight(self.guide, choice)

    @property
    def elbo(self) -> ELBO:
        """The objective (:class:`pyro_bbb.ELBO`) of the training step.

        Examples
        --------
        See the module example (``module.elbo.step``).
        """
        return self.pyro_step.elbo

    @elbo.setter
    def elbo(self, value: ELBO) -> None:
        self.pyro_step.elbo = value

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.pyro_optimizer is None:
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        if isinstance(self.pyro_optimizer, IVON):
            self.pyro_optimizer.check_training(self.guide, self.elbo, clip_norm=self.trainer.gradient_clip_val,
                                               clipping_option="Trainer(gradient_clip_val)")
            if self.trainer.accumulate_grad_batches != 1:
                raise ValueError(
                    f"Trainer(accumulate_grad_batches={self.trainer.accumulate_grad_batches}) sums the gradients of "
                    "several batches, and IVON reads the likelihood's curvature off the gradient of one ELBO "
                    "estimate: drop accumulate_grad_batches (a larger batch_size in the DataLoader does what it "
                    "would), or train with pyro_bbb.optim.Adam."
                )
        return _PyroOptimizerStep(self.parameters(), self.pyro_optimizer)


class _PyroOptimizerStep(torch.optim.Optimizer):
    """Lightning's handle on a Pyro optimizer: ``step(closure)`` runs the closure (loss and gradients), then the Pyro
    optimizer on the parameters that got a gradient; its state dict is the Pyro optimizer's, keyed by name."""

    def __init__(self, params, pyro_optimizer: PyroOptim):
        super().__init__(params, {})
        self.pyro_optimizer = pyro_optimizer

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if params:
            self.pyro_optimizer(params)
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"pyro_optimizer": self.pyro_optimizer.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pyro_optimizer.set_state(state_dict["pyro_optimizer"])


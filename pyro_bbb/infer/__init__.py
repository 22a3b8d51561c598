"""Variational inference: the mean-field guide (:mod:`~pyro_bbb.infer.guide`, which also answers what any mean-field
guide's posterior at a site is), the ELBO that scales minibatches (:mod:`~pyro_bbb.infer.elbo`, its reference path,
with the data plate's scaling in :mod:`~pyro_bbb.infer.scaling`; the KL arithmetic, the per-pair state, a call's
terms are private; the replayed backend, :class:`ReplayBackend`, is shared with the MAP warm start of
:mod:`pyro_bbb.train.warm_start`), the record of which objective computed the gradients an optimizer
applies (:mod:`~pyro_bbb.infer.contract`), the lower-variance gradient estimators as effect handlers
(:mod:`~pyro_bbb.infer.estimators`), KL-weight schedules (:mod:`~pyro_bbb.infer.schedules`) and the record of
the KL weight a posterior was trained at (:mod:`~pyro_bbb.infer.tempering`; whether another objective trained it
since: :mod:`~pyro_bbb.infer.outside_training`).

Examples
--------
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> svi = pyro.infer.SVI(bnn, pyro_bbb.infer.MeanFieldGuide(bnn), pyro_bbb.optim.Adam(lr=1e-2),
...                      pyro_bbb.infer.ELBO(num_data=100))
>>> with pyro_bbb.infer.flipout():
...     loss = svi.step(torch.randn(10, 3), torch.randn(10))
"""

from . import schedules
from ._replay import ReplayBackend
from .elbo import ELBO
from .estimators import (
    FlipoutMessenger,
    LocalReparameterizationMessenger,
    MomentPropagationMessenger,
    flipout,
    local_reparameterization,
    moment_propagation,
)
from .guide import DEFAULT_INIT_SCALE, MeanFieldGuide
from .scaling import DataPlateScaleMessenger, scale_data_plate

__all__ = [
    "ELBO", "MeanFieldGuide", "DEFAULT_INIT_SCALE", "flipout", "local_reparameterization", "moment_propagation",
    "FlipoutMessenger", "LocalReparameterizationMessenger", "MomentPropagationMessenger", "DataPlateScaleMessenger",
    "scale_data_plate", "schedules", "ReplayBackend",
]

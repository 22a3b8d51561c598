"""Variational inference: the mean-field guide (:mod:`~pyro_bbb.infer.guide`), the ELBO that scales minibatches
(:mod:`~pyro_bbb.infer.elbo`, with the data plate's scaling in :mod:`~pyro_bbb.infer.scaling`, the KL arithmetic in
:mod:`~pyro_bbb.infer._kl` and the replayed fast path in ``_replay``), the lower-variance gradient estimators as
effect handlers (:mod:`~pyro_bbb.infer.estimators`) and KL-weight schedules (:mod:`~pyro_bbb.infer.schedules`).

Examples
--------
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> svi = pyro.infer.SVI(bnn, pyro_bbb.infer.MeanFieldGuide(bnn), pyro_bbb.optim.Adam(lr=1e-2),
...                      pyro_bbb.infer.ELBO(num_data=100))
>>> with pyro_bbb.infer.flipout():
...     loss = svi.step(torch.randn(10, 3), torch.randn(10))
"""

from . import schedules
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
    "scale_data_plate", "schedules",
]

"""The Bayesian MLP shared by the benchmark scripts."""

from __future__ import annotations

import math
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

from pyro_bbb.nn import BayesianLinear


class BayesianMLP(PyroModule):
    """``widths[0] -> ... -> widths[-1] = 1`` regression net; ``sigma=None`` learns the noise (LogNormal prior)."""

    def __init__(self, widths: list[int], activation: Callable = torch.relu, sigma: float | None = None):
        super().__init__()
        self.layers = PyroModule[torch.nn.ModuleList]([BayesianLinear(a, b) for a, b in zip(widths[:-1], widths[1:])])
        self.activation = activation
        self.sigma = sigma

    def forward(self, x, y=None):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        mean = pyro.deterministic("mean", x.squeeze(-1))
        sigma = self.sigma
        if sigma is None:
            sigma = pyro.sample("sigma", dist.LogNormal(math.log(0.1), 1.0))
        with pyro.plate("data", mean.shape[-1]):
            return pyro.sample("y", dist.Normal(mean, sigma), obs=y)

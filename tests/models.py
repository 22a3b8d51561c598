"""Small models shared by the tests."""

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

from pyro_bbb.nn import BayesianLinear


class Regression(PyroModule):
    """y ~ Normal(BayesianLinear(x), sigma), the likelihood inside pyro.plate("data")."""

    def __init__(self, in_features=3, prior=None, sigma=0.5, subsample_size=None, num_data=None):
        super().__init__()
        self.fc = BayesianLinear(in_features, 1, prior=prior)
        self.sigma = sigma
        self.subsample_size = subsample_size
        self.num_data = num_data

    def forward(self, x, y=None, idx=None):
        mean = self.fc(x).squeeze(-1)
        pyro.deterministic("mean", mean)
        if idx is not None:  # Pyro's own subsampling: plate of the full size with explicit indices
            plate = pyro.plate("data", self.num_data, subsample=idx)
        else:
            plate = pyro.plate("data", x.shape[0])
        with plate:
            return pyro.sample("y", dist.Normal(mean, self.sigma), obs=y)


class MLP(PyroModule):
    def __init__(self, in_features=2, hidden=8, prior=None):
        super().__init__()
        self.fc1 = BayesianLinear(in_features, hidden, prior=prior)
        self.act = torch.nn.Tanh()
        self.fc2 = BayesianLinear(hidden, 1, prior=prior)

    def forward(self, x, y=None):
        mean = pyro.deterministic("mean", self.fc2(self.act(self.fc1(x))).squeeze(-1))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(mean, 0.1), obs=y)


def regression_data(n=100, d=3, sigma=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.linspace(-1.0, 1.0, d)
    y = x @ w + 0.2 + sigma * torch.randn(n, generator=g)
    return x, y

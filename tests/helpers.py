"""Small models, data and helpers shared by the tests."""

import functools

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

import pyro_bbb
from pyro_bbb import MeanFieldGuide, likelihoods
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


class BatchCentred(PyroModule):
    """A hand-written model whose ``h - h.mean(0)`` reads the draw dimension as the batch: a silently wrong
    vectorized pass, which predict must detect by comparing draw 0 with the same draw alone."""

    def __init__(self):
        super().__init__()
        self.fc = BayesianLinear(3, 4)
        self.out = BayesianLinear(4, 1)

    def forward(self, x, y=None):
        h = self.fc(x)
        mean = self.out(h - h.mean(0)).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(mean, 0.1), obs=y)


class Routed(torch.nn.Module):
    """A mixture's routing: an expert applied to the rows a Bayesian gate selects (``x[mask]``), the other rows 0.
    Each weight draw of the gate selects rows of its own."""

    def __init__(self):
        super().__init__()
        self.gate = BayesianLinear(1, 1, bias=False)
        self.expert = BayesianLinear(1, 1, bias=False)

    def forward(self, x):
        mask = self.gate(x).squeeze(-1) > 0
        out = torch.zeros(x.shape[0], 1)
        out[mask] = self.expert(x[mask])
        return out


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


@functools.cache
def digits_fit(kl_weight=1.0, epochs=300):
    """A 64-100-10 Bayesian MLP fitted to scikit-learn's digits (cached: several slow tests share the fits).

    The N(0, 2) prior: with N(0, 1) the mean-field posterior is underconfident on digits (``benchmarks/README.md``).
    """
    import pyro_bbb
    from pyro_bbb import likelihoods, priors
    from pyro_bbb.data.datasets import digits

    pyro.clear_param_store()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    prior = priors.Normal(0.0, 2.0)
    net = torch.nn.Sequential(
        BayesianLinear(64, 100, prior=prior), torch.nn.ReLU(), BayesianLinear(100, 10, prior=prior)
    )
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=128, lr=1e-2,
                           kl_weight=kl_weight, progress=False, seed=0)
    return bnn, guide, history, (x_train, y_train, x_test, y_test)


def regression_model(likelihood=None, hidden=8):
    """A 2-hidden-1 tanh BNN with a Gaussian likelihood (noise 0.5 unless another likelihood is given)."""
    net = torch.nn.Sequential(BayesianLinear(2, hidden), torch.nn.Tanh(), BayesianLinear(hidden, 1))
    return pyro_bbb.BNN(net, likelihood or likelihoods.Gaussian(scale=0.5))


def small_data(n=50, seed=0):
    """``n`` points of ``y = x1 + x2 + noise`` for :func:`regression_model`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x.sum(-1) + 0.5 * torch.randn(n, generator=g)


def params():
    """A copy of every parameter in Pyro's param store."""
    return {k: v.detach().clone() for k, v in pyro.get_param_store().items()}


def fitted_3_5_1(prior=None, init_scale=0.1):
    """A 3-5-1 tanh BNN, its guide set up on 10 random points, and those points."""
    net = torch.nn.Sequential(BayesianLinear(3, 5, prior=prior), torch.nn.Tanh(), BayesianLinear(5, 1, prior=prior))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=init_scale)
    x, y = torch.randn(10, 3), torch.randn(10)
    guide(x, y)
    return bnn, guide, x, y


def guide_for(model, *args, **kwargs):
    """A MeanFieldGuide of ``model`` set up by one call on ``args``."""
    guide = MeanFieldGuide(model, **kwargs)
    guide(*args)
    return guide


def minibatches(n, batch_size, generator):
    """A random permutation of ``range(n)`` in batches of ``batch_size`` (the last one partial)."""
    perm = torch.randperm(n, generator=generator)
    return [perm[i : i + batch_size] for i in range(0, n, batch_size)]


class MultiOutput(PyroModule):
    """Multi-output regression the way Pyro's tutorials write it: a plate over the outputs inside the data plate."""

    def __init__(self, outputs=3, sigma=0.5):
        super().__init__()
        self.fc = BayesianLinear(2, outputs)
        self.outputs, self.sigma = outputs, sigma

    def forward(self, x, y=None):
        mean = self.fc(x)
        with pyro.plate("data", x.shape[0], dim=-2), pyro.plate("outputs", self.outputs, dim=-1):
            return pyro.sample("y", dist.Normal(mean, self.sigma), obs=y)

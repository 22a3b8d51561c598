"""What a user would pick instead of a Bayesian net, written in plain PyTorch for ``uncertainty.py``: a deterministic
net (and its temperature-scaled predictive), MC dropout, a deep ensemble and a diagonal last-layer Laplace
approximation. laplace-torch does not import with the pinned torch when installed without its dependencies (it needs
``asdl``), so the Laplace approximation is written here; ``tests/test_benchmarks.py`` proves it on a linear model
(softmax regression), where its diagonal precision equals the exact Hessian's diagonal of the negative log posterior.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

#: bayesian-torch 0.5's README settings for ``dnn_to_bnn`` (its MOPED flow sets ``moped_enable``).
BAYESIAN_TORCH_PRIOR = {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -3.0,
                        "type": "Reparameterization", "moped_enable": False, "moped_delta": 0.5}

#: epochs of the MOPED flow's fine-tuning after the deterministic net (bayesian-torch's example)
MOPED_EPOCHS = 20


def bayesian_torch_flow(net: nn.Module, train: Callable[[nn.Module, int, Callable | None], object], epochs: int,
                        moped: bool):
    """bayesian-torch 0.5's README recipe on ``net`` (``dnn_to_bnn`` in place, then ``train(net, epochs, kl)`` with
    its ``get_kl_loss``), or with ``moped`` its MOPED flow: ``train(net, epochs, None)`` as a deterministic net first,
    the posterior started at its weights, ``MOPED_EPOCHS`` of the recipe. Returns what the last ``train`` returns. A
    benchmark dependency only (``pip install bayesian-torch==0.5.0 --no-deps``)."""
    from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

    if moped:
        train(net, epochs, None)
    dnn_to_bnn(net, BAYESIAN_TORCH_PRIOR | {"moped_enable": moped})
    return train(net, MOPED_EPOCHS if moped else epochs, get_kl_loss)


def train_net(net: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int = 64,
              lr: float = 1e-3, weight_decay: float = 1e-4, seed: int = 0,
              kl: Callable[[nn.Module], torch.Tensor] | None = None) -> nn.Module:
    """Minibatch Adam on the cross-entropy (with weight decay), plus ``kl(net) / batch_size`` when given
    (bayesian-torch's README recipe); returns the net in eval mode."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(batch_size):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            if kl is not None:
                loss = loss + kl(net) / batch_size
            loss.backward()
            optimizer.step()
    return net.eval()


@torch.no_grad()
def softmax_probs(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(net.eval()(x), -1)


@torch.no_grad()
def mc_dropout_probs(net: nn.Module, x: torch.Tensor, num_samples: int = 50) -> torch.Tensor:
    """``(num_samples, batch, C)`` softmax outputs with dropout on."""
    net.train()
    probs = torch.stack([torch.softmax(net(x), -1) for _ in range(num_samples)])
    net.eval()
    return probs


class DiagonalLastLayerLaplace:
    """A Gaussian over the last ``nn.Linear``'s weights and bias centred at the trained values, with the diagonal of
    the generalised Gauss-Newton matrix of the cross-entropy plus a prior precision as its precision:
    ``sum_n phi_n^2 p_nc (1 - p_nc) + tau`` for weight ``(c, d)`` (``phi`` the features into the last layer, with a
    1 for the bias). ``tau`` is chosen on a validation split by the predictive NLL (laplace-torch's
    ``optimize_prior_precision(method="gridsearch")``).

    ``features(x)`` maps inputs to the last layer's inputs; ``last`` is that layer.
    """

    def __init__(self, features: Callable[[torch.Tensor], torch.Tensor], last: nn.Linear):
        self.features, self.last = features, last
        self.prior_precision = 1.0
        self.ggn_diagonal: torch.Tensor | None = None

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> DiagonalLastLayerLaplace:
        phi = self._augmented(x)  # (n, D + 1)
        p = torch.softmax(phi @ self._weights().T, -1)  # (n, C)
        self.ggn_diagonal = (p * (1 - p)).T @ phi.square()  # (C, D + 1)
        return self

    def _augmented(self, x: torch.Tensor) -> torch.Tensor:
        phi = self.features(x)
        return torch.cat([phi, torch.ones(phi.shape[0], 1, dtype=phi.dtype)], -1)

    def _weights(self) -> torch.Tensor:
        return torch.cat([self.last.weight, self.last.bias.unsqueeze(-1)], -1).detach()

    def precision(self) -> torch.Tensor:
        return self.ggn_diagonal + self.prior_precision

    @torch.no_grad()
    def probs(self, x: torch.Tensor, num_samples: int = 100, seed: int = 0) -> torch.Tensor:
        """``(num_samples, batch, C)`` softmax outputs of last-layer weights drawn from the Laplace posterior."""
        g = torch.Generator().manual_seed(seed)
        phi, mean, std = self._augmented(x), self._weights(), self.precision().rsqrt()
        noise = torch.randn((num_samples, *mean.shape), generator=g, dtype=mean.dtype)
        return torch.softmax(torch.einsum("nd,scd->snc", phi, mean + std * noise), -1)

    def choose_prior_precision(self, x_val: torch.Tensor, y_val: torch.Tensor,
                               grid=tuple(10.0 ** k for k in range(-2, 5))) -> float:
        """The prior precision of the grid whose predictive NLL on the validation split is lowest."""
        best = (math.inf, self.prior_precision)
        for tau in grid:
            self.prior_precision = tau
            probs = self.probs(x_val).mean(0)
            nll = float(nn.functional.nll_loss(probs.clamp_min(1e-12).log(), y_val))
            best = min(best, (nll, tau))
        self.prior_precision = best[1]
        return self.prior_precision

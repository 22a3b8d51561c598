"""``BayesianLinear``: the Bayes-by-Backprop twin of :class:`torch.nn.Linear`."""

from __future__ import annotations

import torch
from torch import nn

from ..priors import Prior
from .functional import batched_linear
from .module import BayesianModule

__all__ = ["BayesianLinear"]


class BayesianLinear(BayesianModule):
    """A linear layer ``y = x W^T + b`` whose ``weight`` and ``bias`` are sample sites with a prior.

    Same constructor, shapes and output as :class:`torch.nn.Linear`, plus ``prior`` (a
    :class:`pyro_bbb.priors.Prior` or any scalar :class:`pyro.distributions.Distribution`; default
    :data:`pyro_bbb.priors.DEFAULT_PRIOR`: ``Normal(0, sqrt(2 / in_features))`` on the weights, ``Normal(0, 1)`` on
    the bias). The initial values (used as starting posterior means) are drawn exactly like ``nn.Linear``'s.
    Weights with leading sample dimensions, ``(*S, out, in)``, are applied in one batched call.

    Parameters
    ----------
    in_features, out_features : int
        Input and output sizes.
    bias : bool
        Whether the layer has a (Bayesian) bias.
    prior : Prior or Distribution, optional
        Prior over every weight and bias element.

    Examples
    --------
    >>> layer = BayesianLinear(3, 2, prior=priors.Normal(0.0, 0.5))
    >>> layer
    BayesianLinear(in_features=3, out_features=2, bias=True, prior=Normal(loc=0.0, scale=0.5))
    >>> layer(torch.randn(4, 3)).shape   # a prior draw when no guide is active
    torch.Size([4, 2])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        prior: Prior | None = None,
    ):
        super().__init__(prior)
        self.in_features = in_features
        self.out_features = out_features
        twin = self._twin(bias, device, dtype)
        self._declare_bayesian("weight", twin.weight, fan_in=in_features)
        self._declare_bayesian("bias", twin.bias, fan_in=in_features)

    def _twin(self, bias: bool, device=None, dtype=None) -> nn.Linear:
        return nn.Linear(self.in_features, self.out_features, bias=bias, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Redraw the initial values the way ``nn.Linear.reset_parameters`` does."""
        twin = self._twin("bias" in self._bayesian, self.weight_init.device, self.weight_init.dtype)
        for name, param in twin.named_parameters():
            self.set_initial_value(name, param)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            raise ValueError(
                f"{type(self).__name__}(in_features={self.in_features}) expects an input whose last dimension is "
                f"{self.in_features}, got shape {tuple(input.shape)}."
            )
        return self._affine(input, batched_linear, feature_dims=1)

    def extra_repr(self) -> str:
        has_bias = "bias" in self._bayesian
        sizes = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{sizes}, bias={has_bias}, {self._prior_repr()}"

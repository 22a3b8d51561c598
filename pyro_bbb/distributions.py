"""Distribution classes pyro_bbb adds to Pyro's: the empirical-Bayes Normal prior, the scale-mixture prior, and
the expected Normal likelihood of moment propagation.

Examples
--------
>>> d = ScaleMixtureNormalDistribution(torch.tensor(0.5), torch.tensor(1.0), torch.tensor(0.1))
>>> d.variance
tensor(0.5050)
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.distributions.util import broadcast_all
from torch.distributions.kl import register_kl

__all__ = ["EmpiricalBayesNormalDistribution", "ScaleMixtureNormalDistribution", "ExpectedNormal"]

class EmpiricalBayesNormalDistribution(TorchDistribution):
    r"""``Normal(0, s)`` over a weight tensor whose variance is set from the posterior (Wu et al. 2019).

    The prior variance ``s^2`` maximises ``ELBO + log InverseGamma(s^2; alpha, beta)`` given the current Normal
    posterior ``q``: ``s^2 = (S + 2 beta) / (m + 2 alpha + 2)`` with ``S = sum(mu^2 + sigma^2)`` over the ``m``
    weights that share it and ``beta = (alpha + 1) * mode_scale^2`` (the hyperprior's mode is ``mode_scale^2``).
    Without a hyperprior (``concentration=None``) it is the plain optimum ``s^2 = S / m``. Only ``KL(q || p)`` is
    defined (registered for a Normal ``q``): its value is the KL to ``Normal(0, s)`` and its gradient is that of
    the maximised objective (``s`` held at its optimum, by the envelope theorem). There is no ``log_prob``: an ELBO
    that scores a weight draw under the prior (Pyro's ``Trace_ELBO`` and ``TraceMeanField_ELBO`` do) cannot see
    ``q`` and gets a clear error instead of a fixed prior's numbers. Draws (e.g. a prior predictive) use the
    hyperprior's mode.

    Parameters
    ----------
    mode_scale : torch.Tensor
        The hyperprior's mode of ``s`` (and the scale prior draws use), broadcast to the distribution's shape.
    concentration : float or None
        The inverse-gamma hyperprior's shape ``alpha``; ``None`` for no hyperprior.
    weight_dims : int
        How many trailing dimensions form one weight tensor (leading ones, e.g. vectorized particles, are batches
        of separate tensors).
    per_unit : bool
        One ``s`` per output unit (first weight dimension) instead of one per tensor.

    Examples
    --------
    >>> p = EmpiricalBayesNormalDistribution(torch.tensor(1.0).expand(4), concentration=None, weight_dims=1)
    >>> q = dist.Normal(torch.tensor([1.0, -1.0, 1.0, -1.0]), 1.0)
    >>> p.scale_given(q)                   # sqrt(mean(mu^2 + sigma^2))
    tensor([1.4142])
    """

    arg_constraints = {"mode_scale": constraints.positive}
    support = constraints.real
    has_rsample = False

    def __init__(self, mode_scale, concentration: float | None, weight_dims: int, per_unit: bool = False,
                 validate_args=None):
        self.mode_scale = torch.as_tensor(mode_scale)
        if weight_dims > self.mode_scale.dim():
            raise ValueError(f"weight_dims={weight_dims} exceeds the {self.mode_scale.dim()} dimensions of mode_scale.")
        self.concentration = concentration
        self.weight_dims = weight_dims
        self.per_unit = per_unit
        super().__init__(self.mode_scale.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(EmpiricalBayesNormalDistribution, _instance)
        batch_shape = torch.Size(batch_shape)
        new.mode_scale = self.mode_scale.expand(batch_shape)
        new.concentration, new.weight_dims, new.per_unit = self.concentration, self.weight_dims, self.per_unit
        super(EmpiricalBayesNormalDistribution, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _shared_dims(self) -> tuple[int, ...]:
        """The (negative) dimensions whose elements share one ``s``."""
        first = -self.weight_dims + (1 if self.per_unit else 0)
        return tuple(range(first, 0))

    def scale_given(self, q: torch.distributions.Normal) -> torch.Tensor:
        """The prior scale ``s`` that goes with the Normal posterior ``q`` (one per tensor or unit, kept as size-1
        dimensions so that it broadcasts over the weights).

        Examples
        --------
        >>> p = priors.EmpiricalBayesNormal(concentration=None, per="unit").distribution((2, 3), fan_in=3).base_dist
        >>> p.scale_given(dist.Normal(torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]), 1.0))
        tensor([[1.4142],
                [2.2361]])
        """
        dims = self._shared_dims()
        loc, scale = torch.broadcast_tensors(q.loc, q.scale)
        second_moment = scale.square() + loc.square()
        if not dims:
            total, count = second_moment, 1
        else:
            total = second_moment.sum(dims, keepdim=True)
            count = math.prod(second_moment.shape[d] for d in dims)
        if self.concentration is None:
            return (total / count).sqrt()
        alpha = self.concentration
        mode = self.mode_scale.amax(dims, keepdim=True) if dims else self.mode_scale
        beta = (alpha + 1.0) * mode.square()
        return ((total + 2.0 * beta) / (count + 2.0 * alpha + 2.0)).sqrt()

    def given_posterior(self, q: torch.distributions.Normal) -> dist.Normal:
        """The Normal prior in force for the posterior ``q``: ``Normal(0, scale_given(q))`` elementwise.

        Examples
        --------
        >>> p = priors.EmpiricalBayesNormal(concentration=None).distribution((2,), fan_in=1).base_dist
        >>> p.given_posterior(dist.Normal(torch.tensor([3.0, 4.0]), 1.0)).scale
        tensor([3.6742, 3.6742])
        """
        scale = self.scale_given(q).expand(torch.broadcast_shapes(q.batch_shape, self.batch_shape))
        return dist.Normal(torch.zeros((), dtype=scale.dtype, device=scale.device), scale)

    def log_prob(self, value):
        raise ValueError(
            "EmpiricalBayesNormal sets its scale from the posterior q, so it has no log-density on its own: only "
            "KL(q || prior) is defined, for a guide that samples the site from a Normal. Use pyro_bbb.ELBO (Pyro's "
            "Trace_ELBO and TraceMeanField_ELBO score the draw under the prior) with pyro_bbb.MeanFieldGuide, Pyro's "
            "AutoNormal or a hand-written Normal guide, or a prior with a density such as priors.FanInNormal (the "
            "layers' default) or priors.LearnedNormal."
        )

    def sample(self, sample_shape=()):
        shape = self._extended_shape(torch.Size(sample_shape))
        with torch.no_grad():
            return torch.randn(shape, dtype=self.mode_scale.dtype, device=self.mode_scale.device) * self.mode_scale

    @property
    def mean(self):
        return torch.zeros_like(self.mode_scale)

    @property
    def variance(self):
        return self.mode_scale.square()


@register_kl(torch.distributions.Normal, EmpiricalBayesNormalDistribution)
def _kl_normal_empirical_bayes(q, p):
    scale = p.scale_given(q).detach()  # at its optimum: the maximised objective's gradient (envelope theorem)
    return scale.log() - q.scale.log() + (q.scale.square() + q.loc.square()) / (2.0 * scale.square()) - 0.5


class ScaleMixtureNormalDistribution(TorchDistribution):
    r"""Elementwise ``pi * N(0, sigma1^2) + (1 - pi) * N(0, sigma2^2)`` (Blundell et al. 2015, eq. 7).

    Its KL divergence to a Normal posterior has no closed form, so :class:`pyro_bbb.ELBO` estimates it by
    Monte Carlo from the guide's draw.

    Examples
    --------
    >>> d = ScaleMixtureNormalDistribution(torch.tensor(0.5), torch.tensor(1.0), torch.tensor(0.01))
    >>> d.log_prob(torch.zeros(3)).shape
    torch.Size([3])
    """

    arg_constraints = {
        "pi": constraints.unit_interval,
        "sigma1": constraints.positive,
        "sigma2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(self, pi, sigma1, sigma2, validate_args=None):
        self.pi, self.sigma1, self.sigma2 = torch.broadcast_tensors(
            torch.as_tensor(pi), torch.as_tensor(sigma1), torch.as_tensor(sigma2)
        )
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ScaleMixtureNormalDistribution, _instance)
        batch_shape = torch.Size(batch_shape)
        new.pi = self.pi.expand(batch_shape)
        new.sigma1 = self.sigma1.expand(batch_shape)
        new.sigma2 = self.sigma2.expand(batch_shape)
        super(ScaleMixtureNormalDistribution, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        wide = torch.distributions.Normal(0.0, self.sigma1).log_prob(value) + torch.log(self.pi)
        narrow = torch.distributions.Normal(0.0, self.sigma2).log_prob(value) + torch.log1p(-self.pi)
        return torch.logaddexp(wide, narrow)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            pick_wide = torch.rand(shape, device=self.pi.device) < self.pi.expand(shape)
            sigma = torch.where(pick_wide, self.sigma1.expand(shape), self.sigma2.expand(shape))
            return torch.randn(shape, device=sigma.device, dtype=sigma.dtype) * sigma

    @property
    def mean(self):
        return torch.zeros_like(self.pi)

    @property
    def variance(self):
        return self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2


class ExpectedNormal(TorchDistribution):
    """The expected Normal log-density over a Gaussian mean ``f ~ Normal(loc, loc_variance)`` and a random scale
    ``s``: ``log_prob(y) = E[log Normal(y | f, s)]
    = -log(2 pi)/2 - E[log s] - ((y - loc)^2 E[s^-2] - 2 (y - loc) E[(f - loc) s^-2] + E[(f - loc)^2 s^-2]) / 2``.
    For ``s`` independent of ``f`` (the default) the last two expectations are ``0`` and ``loc_variance E[s^-2]``;
    a scale that shares the network's hidden units with the mean is correlated with it, and passes them in. It is
    what the likelihoods of :mod:`pyro_bbb.likelihoods` observe under moment propagation; it is not a normalised
    density of ``y`` and draws nothing (predict outside the handler).

    Parameters
    ----------
    loc, loc_variance : torch.Tensor
        Mean and variance of the network's output.
    expected_log_scale, expected_precision : torch.Tensor
        ``E[log s]`` and ``E[1 / s^2]`` (a fixed scale: ``log s`` and ``1 / s^2``).
    validate_args : bool, optional
        As for every torch distribution.
    deviation_precision, variance_precision : torch.Tensor, optional
        ``E[(f - loc) / s^2]`` and ``E[(f - loc)^2 / s^2]`` where ``s`` is correlated with ``f`` (keyword only).

    Examples
    --------
    >>> fn = ExpectedNormal(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0), torch.tensor(1.0))
    >>> float(fn.log_prob(torch.tensor(0.0)) - dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.0)))   # -1/2
    -0.5
    """

    arg_constraints = {"loc": constraints.real, "loc_variance": constraints.greater_than_eq(0.0),
                       "expected_log_scale": constraints.real, "expected_precision": constraints.positive,
                       "deviation_precision": constraints.real,
                       "variance_precision": constraints.greater_than_eq(0.0)}
    support = constraints.real
    has_rsample = False
    _PARAMETERS = ("loc", "loc_variance", "expected_log_scale", "expected_precision", "deviation_precision",
                   "variance_precision")

    def __init__(self, loc, loc_variance, expected_log_scale, expected_precision, validate_args=None, *,
                 deviation_precision=None, variance_precision=None):
        if deviation_precision is None:
            deviation_precision = torch.zeros_like(torch.as_tensor(loc))
        if variance_precision is None:
            variance_precision = loc_variance * expected_precision
        values = broadcast_all(loc, loc_variance, expected_log_scale, expected_precision, deviation_precision,
                               variance_precision)
        for name, value in zip(self._PARAMETERS, values, strict=True):
            setattr(self, name, value)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ExpectedNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        for name in self._PARAMETERS:
            setattr(new, name, getattr(self, name).expand(batch_shape))
        super(ExpectedNormal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        error = value - self.loc
        squared = error.pow(2) * self.expected_precision - 2 * error * self.deviation_precision
        squared = squared + self.variance_precision
        return -0.5 * math.log(2 * math.pi) - self.expected_log_scale - 0.5 * squared

    def sample(self, sample_shape: tuple[int, ...] = ()):
        raise NotImplementedError(
            "ExpectedNormal is the expected log-likelihood that moment propagation trains with; it draws nothing. "
            "Predict outside pyro_bbb.moment_propagation() (pyro_bbb.predict)."
        )

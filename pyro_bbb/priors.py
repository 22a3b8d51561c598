"""Weight priors for Bayesian layers.

A prior turns the shape and fan-in of one layer parameter into a Pyro distribution over the whole tensor
(every element independent, reinterpreted with ``to_event`` so that one sample site covers the tensor).
Any :class:`pyro.distributions.Distribution` is accepted where a prior is expected, see :func:`as_prior`.

Examples
--------
>>> d = priors.Normal(0.0, 0.5).distribution((3, 2), fan_in=2)
>>> d.event_shape
torch.Size([3, 2])
"""

from __future__ import annotations

import math
from numbers import Real

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ._checks import check_finite, check_positive
from ._internals import tensor_version
from .distributions import EmpiricalBayesNormalDistribution, ScaleMixtureNormalDistribution

__all__ = [
    "Prior",
    "Normal",
    "Laplace",
    "ScaleMixtureNormal",
    "FanInNormal",
    "Moped",
    "LearnedNormal",
    "EmpiricalBayesNormal",
    "prior_in_force",
    "DistributionPrior",
    "as_prior",
    "prior_state",
    "is_real_support",
    "strip_independent",
    "prior_std",
    "initial_width",
    "DEFAULT_PRIOR",
]


def _whole_tensor(d: dist.Distribution, shape: torch.Size) -> dist.Distribution:
    """Expand a scalar distribution to ``shape`` and make the whole tensor one event."""
    return d.expand(shape).to_event(len(shape))


class Prior:
    """Base class: a recipe that builds the prior distribution of one parameter tensor.

    Subclasses implement :meth:`distribution`. Priors are small immutable value objects; their
    ``repr`` is what layers show.

    Examples
    --------
    >>> class Cauchy(Prior):
    ...     def distribution(self, shape, fan_in, *, device=None, dtype=None):
    ...         zero = torch.zeros((), device=device, dtype=dtype)
    ...         return dist.Cauchy(zero, 1.0).expand(shape).to_event(len(shape))
    """

    def distribution(
        self,
        shape: torch.Size | tuple[int, ...],
        fan_in: int,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> dist.Distribution:
        """Return the prior over a tensor of ``shape`` whose layer has ``fan_in`` inputs per output."""
        raise NotImplementedError

    def _fields(self) -> dict[str, float]:
        return dict(vars(self))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._fields().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self), tuple(self._fields().items())))


def _scalar(value: float, device, dtype) -> torch.Tensor:
    return torch.tensor(value, device=device, dtype=dtype or torch.get_default_dtype())


class _LocScalePrior(Prior):
    """A location-scale family applied independently to every weight."""

    family: type[dist.Distribution]

    def __init__(self, loc: float = 0.0, scale: float = 1.0):
        self.loc = check_finite("loc", loc)
        self.scale = check_positive("scale", scale)

    def distribution(self, shape, fan_in, *, device=None, dtype=None):
        element = self.family(_scalar(self.loc, device, dtype), _scalar(self.scale, device, dtype))
        return _whole_tensor(element, torch.Size(shape))


class Normal(_LocScalePrior):
    """Independent ``Normal(loc, scale)`` on every weight (closed-form KL to a Normal posterior).

    Examples
    --------
    >>> Normal(0.0, 0.1)
    Normal(loc=0.0, scale=0.1)
    """

    family = dist.Normal


class Laplace(_LocScalePrior):
    """Independent ``Laplace(loc, scale)`` on every weight (sparsity-inducing; closed-form KL to a Normal).

    Examples
    --------
    >>> Laplace(scale=0.5)
    Laplace(loc=0.0, scale=0.5)
    """

    family = dist.Laplace


class FanInNormal(Prior):
    """``Normal(0, gain / sqrt(fan_in))``: a prior whose width follows the layer's fan-in.

    ``fan_in`` is ``in_features`` for a linear layer and ``in_channels / groups * prod(kernel_size)``
    for a convolution; the bias uses the fan-in of its layer, or ``Normal(0, bias_scale)`` when ``bias_scale`` is
    given (a one-dimensional parameter is a layer's bias).

    With ``gain=sqrt(2)`` (He et al.'s scale for ReLU networks) and ``bias_scale=1`` it is the layers' default,
    :data:`DEFAULT_PRIOR`: a prior predictive of the right size at any width (``Normal(0, 1)`` on a 50-unit layer
    makes its outputs about 7 times wider than its inputs), and biases free to place a unit's kink anywhere in the
    range of standardised inputs.

    Examples
    --------
    >>> FanInNormal(gain=2.0).distribution((4, 16), fan_in=16).base_dist.scale.unique()
    tensor([0.5000])
    >>> FanInNormal(gain=2.0, bias_scale=1.0).distribution((4,), fan_in=16).base_dist.scale.unique()
    tensor([1.])
    """

    def __init__(self, gain: float = 1.0, bias_scale: float | None = None):
        self.gain = check_positive("gain", gain)
        self.bias_scale = check_positive("bias_scale", bias_scale, optional=True)

    def _fields(self) -> dict[str, float]:
        return {"gain": self.gain} if self.bias_scale is None else dict(vars(self))

    def std(self, fan_in: int, bias: bool = False) -> float:
        """The prior standard deviation of a weight (or with ``bias=True`` a bias) of a layer with ``fan_in``
        inputs."""
        if bias and self.bias_scale is not None:
            return self.bias_scale
        if fan_in <= 0:
            raise ValueError(f"FanInNormal needs fan_in > 0, got {fan_in}.")
        return self.gain / math.sqrt(fan_in)

    def distribution(self, shape, fan_in, *, device=None, dtype=None):
        zero = _scalar(0.0, device, dtype)
        std = self.std(fan_in, bias=len(shape) == 1)
        return _whole_tensor(dist.Normal(zero, _scalar(std, device, dtype)), torch.Size(shape))


class Moped(Prior):
    """MOPED (Krishnan et al. 2020): a prior centred on pretrained weights, scaled relative to them.

    For a weight whose pretrained value is ``w``: prior ``Normal(w, delta * |w|)`` (at least ``min_scale``), and the
    posterior starts at the same place and width. Meant for :func:`pyro_bbb.bayesianize` with
    ``init_from_weights=True``; on a freshly initialised layer ``w`` is the layer's own random initialisation.

    Parameters
    ----------
    delta : float
        Relative width: the prior (and initial posterior) std of a weight is ``delta * |w|``.
    min_scale : float
        Floor on that std (weights that are exactly 0 still get a proper prior).

    Examples
    --------
    >>> d = Moped(delta=0.1).distribution((2,), fan_in=1, init=torch.tensor([1.0, -3.0]))
    >>> d.base_dist.loc, d.base_dist.scale
    (tensor([ 1., -3.]), tensor([0.1000, 0.3000]))
    """

    #: ``distribution`` needs the layer's initial values (``init=``).
    uses_init = True

    def __init__(self, delta: float = 0.1, min_scale: float = 1e-3):
        self.delta = check_positive("delta", delta)
        self.min_scale = check_positive("min_scale", min_scale)

    def scale(self, init: torch.Tensor) -> torch.Tensor:
        """The per-weight prior (and initial posterior) standard deviation, ``max(delta * |w|, min_scale)``."""
        return (self.delta * init.abs()).clamp_min(self.min_scale)

    def distribution(self, shape, fan_in, *, device=None, dtype=None, init=None):
        if init is None:
            raise ValueError("Moped is centred on the layer's weights: its distribution needs `init=` (the weights).")
        init = init.detach().to(device=device, dtype=dtype)
        if init.shape != torch.Size(shape):
            raise ValueError(f"Moped got init of shape {tuple(init.shape)} for a parameter of shape {tuple(shape)}.")
        return dist.Normal(init, self.scale(init)).to_event(len(shape))


class LearnedNormal(Prior):
    """Empirical Bayes: ``Normal(0, s)`` on every weight, with the scale ``s`` learned by maximising the ELBO.

    A fixed ``Normal(0, 1)`` is far too wide for most layers, and at a converged ELBO its KL pulls the posterior
    towards it and underfits. Here each Bayesian layer owns its prior scale as a parameter (a
    :class:`~pyro.nn.PyroParam` ``<name>_prior_scale`` on the layer, so it is a ``pyro.param`` of the model that
    ``SVI``/:func:`pyro_bbb.fit` optimise, that follows ``.to(device)`` and is saved with the model). Only the KL
    depends on it; its optimum given a Normal posterior ``q`` is ``s^2 = mean(mu^2 + sigma^2)`` over the weights
    that share it, which training reaches by gradient steps on ``log s``.

    Caveat: on a task whose likelihood sits on a plateau before it starts to learn (the Embedded Reber Grammar LSTM
    of ``benchmarks/reber_convergence.py``), the optimum *given the current posterior* shrinks every scale while the
    data has not yet pulled any weight away from zero, and the network collapses to its prior (also with a
    ``min_scale`` floor). Adam moves ``log s`` at its learning rate whatever the KL's weight, so a KL warm-up does
    not slow this. Use a fixed prior there.

    Parameters
    ----------
    init_scale : float
        The prior scale before training.
    per : {"tensor", "unit"}
        One scale per parameter tensor (a layer's weight and its bias each have one), or one per output unit (row
        of the weight, element of the bias).
    min_scale : float
        Floor on the learned scale, so that a layer whose posterior shrinks to zero cannot drag its prior (and the
        KL's gradients) into a degenerate point.

    Examples
    --------
    >>> layer = BayesianLinear(3, 2, prior=LearnedNormal(init_scale=0.5))
    >>> float(layer.weight_prior_scale)                # a parameter of the model, trained with the posterior
    0.5
    >>> layer.prior_distribution("weight").base_dist.scale.requires_grad
    True
    """

    #: The layer keeps the scale as a parameter and passes it as ``scale=`` to :meth:`distribution`.
    learned = True

    def __init__(self, init_scale: float = 1.0, per: str = "tensor", min_scale: float = 1e-3):
        self.init_scale = check_positive("init_scale", init_scale)
        if per not in ("tensor", "unit"):
            raise ValueError(f'`per` must be "tensor" (one scale per weight tensor) or "unit" (one per output unit), '
                             f"got {per!r}.")
        self.per = per
        self.min_scale = check_positive("min_scale", min_scale)
        if self.min_scale >= self.init_scale:
            raise ValueError(f"`min_scale` ({min_scale}) must be below `init_scale` ({init_scale}).")

    @property
    def constraint(self) -> constraints.Constraint:
        """The learned scale's support: above ``min_scale``."""
        return constraints.greater_than(self.min_scale)

    def initial_scale(self, shape, *, device=None, dtype=None) -> torch.Tensor:
        """The scale before training: a scalar, or ``(shape[0], 1, ...)`` with ``per="unit"``."""
        shape = torch.Size(shape)
        scale_shape = (shape[0],) + (1,) * (len(shape) - 1) if self.per == "unit" and len(shape) else ()
        return torch.full(scale_shape, self.init_scale, device=device, dtype=dtype or torch.get_default_dtype())

    def distribution(self, shape, fan_in, *, device=None, dtype=None, scale=None):
        """The prior at the layer's current ``scale`` (the initial scale when none is given)."""
        shape = torch.Size(shape)
        if scale is None:
            scale = self.initial_scale(shape, device=device, dtype=dtype)
        zero = torch.zeros((), device=scale.device, dtype=scale.dtype)
        return dist.Normal(zero, scale).expand(shape).to_event(len(shape))


class EmpiricalBayesNormal(Prior):
    """Empirical Bayes with a closed-form scale: ``Normal(0, s)`` whose ``s`` is set from the posterior at every step.

    Wu et al. (2019, "Deterministic variational inference for robust Bayesian neural networks") replace the prior
    variance of each weight tensor by its optimum given the posterior under an inverse-gamma hyperprior, ``s^2 =
    (sum(mu^2 + sigma^2) + 2 beta) / (m + 2 alpha + 2)``, with the hyperprior's mode at the fan-in scale
    ``(gain / sqrt(fan_in))^2`` and ``alpha = 4.4798`` (their choice). While the data says nothing about a layer, the
    hyperprior holds its scale near the mode instead of letting it shrink to zero (what a freely learned scale,
    :class:`LearnedNormal`, does on a plateau); with many weights the data's term dominates. Nothing is learned by
    gradient steps: the scale follows the posterior exactly, see
    :class:`~pyro_bbb.distributions.EmpiricalBayesNormalDistribution`.

    The hyperprior removes the collapse of the plain optimum; ``benchmarks/README.md`` compares both with a fixed
    ``Normal(0, 1)`` on UCI. On a task whose likelihood sits on a plateau (the Embedded Reber LSTM) it collapses as
    :class:`LearnedNormal` does -- with hundreds of weights per tensor the data's term dominates the hyperprior, so
    the scale follows the weights' own (initially small) magnitude. Use a fixed, wide prior there.
    Needs :class:`pyro_bbb.ELBO` (what :func:`pyro_bbb.fit` uses) and a guide that samples each weight from a Normal
    (:class:`pyro_bbb.MeanFieldGuide`, a hand-written guide, or Pyro's ``AutoNormal``, whose auxiliary Normal draw
    the ELBO reads); Pyro's ``Trace_ELBO``/``TraceMeanField_ELBO`` (which score the weight draw under the prior),
    NUTS and ``poutine.condition`` on a weight need a density and get a clear error. On the UCI development sets it
    has the best training ELBO of the priors measured (``benchmarks/evidence.py``); for that reason of density it is
    not the layers' default (:data:`DEFAULT_PRIOR`).

    Parameters
    ----------
    gain : float
        The hyperprior's mode of ``s`` is ``gain / sqrt(fan_in)``.
    concentration : float or None
        The inverse-gamma hyperprior's shape ``alpha`` (larger holds ``s`` closer to the mode); ``None`` drops the
        hyperprior: ``s^2 = mean(mu^2 + sigma^2)``.
    per : {"tensor", "unit"}
        One scale per parameter tensor, or one per output unit.

    Examples
    --------
    >>> layer = BayesianLinear(4, 3, prior=EmpiricalBayesNormal())
    >>> p = layer.prior_distribution("weight")
    >>> q = dist.Normal(torch.zeros(3, 4), 0.5)
    >>> prior_in_force(p, q.to_event(2)).base_dist.scale[0, 0]    # the posterior's width and the mode (1/sqrt(4))
    tensor(0.5000)
    >>> prior_in_force(p, dist.Normal(torch.full((3, 4), 2.0), 0.5).to_event(2)).base_dist.scale[0, 0]
    tensor(1.5299)
    """

    def __init__(self, gain: float = 1.0, concentration: float | None = 4.4798, per: str = "tensor"):
        self.gain = check_positive("gain", gain)
        if concentration is not None:
            concentration = check_positive("concentration", concentration)
        self.concentration = concentration
        if per not in ("tensor", "unit"):
            raise ValueError(f'`per` must be "tensor" (one scale per weight tensor) or "unit" (one per output unit), '
                             f"got {per!r}.")
        self.per = per

    def distribution(self, shape, fan_in, *, device=None, dtype=None):
        shape = torch.Size(shape)
        if fan_in <= 0:
            raise ValueError(f"EmpiricalBayesNormal needs fan_in > 0, got {fan_in}.")
        mode = _scalar(self.gain / math.sqrt(fan_in), device, dtype).expand(shape)
        base = EmpiricalBayesNormalDistribution(mode, self.concentration, len(shape), per_unit=self.per == "unit")
        return base.to_event(len(shape))


def prior_in_force(p: torch.distributions.Distribution, q: torch.distributions.Distribution):
    """The prior that applies to posterior ``q``: ``p`` itself, or for an :class:`EmpiricalBayesNormal` prior the
    Normal at the scale it takes given ``q`` (what summaries and plots compare the posterior with).

    Examples
    --------
    >>> p = EmpiricalBayesNormal(concentration=None).distribution((2,), fan_in=1)
    >>> prior_in_force(p, dist.Normal(torch.tensor([3.0, 4.0]), 1.0).to_event(1)).base_dist.scale
    tensor([3.6742, 3.6742])
    """
    base = strip_independent(p)
    if not isinstance(base, EmpiricalBayesNormalDistribution):
        return p
    return base.given_posterior(strip_independent(q)).to_event(len(p.event_shape))


class ScaleMixtureNormal(Prior):
    """The scale-mixture prior of "Weight Uncertainty in Neural Networks" (Blundell et al. 2015).

    ``pi * N(0, sigma1^2) + (1 - pi) * N(0, sigma2^2)`` on every weight; typically ``sigma1`` is wide and
    ``sigma2`` tiny so that most weights are pulled to zero while a few stay large. The KL term is estimated
    by Monte Carlo.

    Examples
    --------
    >>> ScaleMixtureNormal(pi=0.25, sigma1=1.0, sigma2=0.001)
    ScaleMixtureNormal(pi=0.25, sigma1=1.0, sigma2=0.001)
    """

    def __init__(self, pi: float = 0.5, sigma1: float = 1.0, sigma2: float = math.exp(-6)):
        if not isinstance(pi, Real) or not 0.0 < pi < 1.0:
            raise ValueError(f"`pi` must lie strictly between 0 and 1, got {pi!r}.")
        self.pi = float(pi)
        self.sigma1 = check_positive("sigma1", sigma1)
        self.sigma2 = check_positive("sigma2", sigma2)

    def distribution(self, shape, fan_in, *, device=None, dtype=None):
        mixture = ScaleMixtureNormalDistribution(
            _scalar(self.pi, device, dtype),
            _scalar(self.sigma1, device, dtype),
            _scalar(self.sigma2, device, dtype),
        )
        return _whole_tensor(mixture, torch.Size(shape))


class DistributionPrior(Prior):
    """Wraps a user's :class:`pyro.distributions.Distribution` so that layers can use it as a prior.

    A distribution with empty batch and event shape is broadcast to every element of the parameter; one whose
    batch or event shape equals the parameter's shape is used as it is. Its parameters stay on the device the
    user created them on.

    Examples
    --------
    >>> DistributionPrior(dist.StudentT(3.0, 0.0, 1.0)).distribution((2, 3), fan_in=3).event_shape
    torch.Size([2, 3])
    """

    def __init__(self, distribution: dist.Distribution):
        if not isinstance(distribution, torch.distributions.Distribution):
            raise TypeError(f"expected a pyro.distributions.Distribution, got {type(distribution).__name__}.")
        if distribution.support is not constraints.real and not is_real_support(distribution.support):
            raise ValueError(
                f"a weight prior must have real support, but {distribution!r} has support "
                f"{distribution.support}; use a distribution over all real numbers (e.g. Normal, Laplace, StudentT)."
            )
        self.dist = distribution

    def _fields(self):
        return {"dist": self.dist}

    def distribution(self, shape, fan_in, *, device=None, dtype=None):
        shape = torch.Size(shape)
        d = self.dist
        full_shape = d.batch_shape + d.event_shape
        if full_shape == torch.Size():
            return _whole_tensor(d, shape)
        if d.event_shape == shape and d.batch_shape == torch.Size():
            return d
        if d.batch_shape == shape and d.event_shape == torch.Size():
            return d.to_event(len(shape))
        raise ValueError(
            f"prior {d!r} has batch shape {tuple(d.batch_shape)} and event shape {tuple(d.event_shape)}, which does "
            f"not fit a parameter of shape {tuple(shape)}. Pass a scalar distribution (it is broadcast to every "
            "weight and bias) or one whose shape equals the parameter's shape."
        )


def prior_state(prior: Prior) -> tuple:
    """A hashable summary of a prior's current values (tensors by identity and in-place version), so that a cache
    of its distributions can tell when the prior has changed.

    Examples
    --------
    >>> p = Normal(0.0, 1.0)
    >>> before = prior_state(p)
    >>> p.scale = 0.5
    >>> prior_state(p) == before
    False
    """
    return tuple((name, _value_state(value)) for name, value in vars(prior).items())


def _value_state(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), tensor_version(value))
    if isinstance(value, torch.distributions.Distribution):
        return ("distribution", id(value), tuple(_value_state(v) for v in vars(value).values()
                                                 if isinstance(v, torch.Tensor)))
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return value


def is_real_support(support) -> bool:
    """Whether a support is the real numbers (also reinterpreted as an event: ``independent(real, n)``).

    Examples
    --------
    >>> is_real_support(constraints.real), is_real_support(constraints.positive)
    (True, False)
    """
    base = getattr(support, "base_constraint", support)
    return base is constraints.real


def strip_independent(d: torch.distributions.Distribution) -> torch.distributions.Distribution:
    """The distribution under any ``Independent`` wrappers (``to_event``).

    Examples
    --------
    >>> strip_independent(dist.Normal(torch.zeros(3), 1.0).to_event(1))
    Normal(loc: torch.Size([3]), scale: torch.Size([3]))
    """
    while isinstance(d, torch.distributions.Independent):
        d = d.base_dist
    return d


#: A Normal's interquartile range in standard deviations (2 * 0.6745)
_NORMAL_IQR = 1.3489795003921634


def prior_std(p: torch.distributions.Distribution, draws: int = 256) -> torch.Tensor:
    """A distribution's standard deviation: exact where known, else from ``draws`` samples. Where it has none that
    is finite (a Cauchy, a Student-t with ``df <= 2``), the standard deviation of the Normal with its interquartile
    range: what the posterior's width is compared with, and starts at with ``init_scale="prior"``.

    Examples
    --------
    >>> float(prior_std(dist.Normal(0.0, 2.0)))
    2.0
    >>> round(float(prior_std(dist.Cauchy(0.0, 1.0))), 4)   # quartiles at -1 and 1
    1.4826
    """
    try:
        std = p.stddev
    except NotImplementedError:
        return p.sample((draws,)).std(0)
    if bool(torch.isfinite(std).all()):
        return std
    quartiles = torch.tensor([0.25, 0.75], dtype=std.dtype, device=std.device)
    try:
        low, high = p.icdf(quartiles.reshape(2, *([1] * std.dim())))
        iqr = high - low
    except NotImplementedError:
        iqr = _iqr_from_draws(p, quartiles, 64 * draws)
    return torch.where(torch.isfinite(std), std, iqr / _NORMAL_IQR)


def _iqr_from_draws(p: torch.distributions.Distribution, quartiles: torch.Tensor, draws: int) -> torch.Tensor:
    """The interquartile range of a distribution without an ``icdf``: a Student-t's from draws of the standard t at
    each of its distinct degrees of freedom (a layer's prior repeats one), scaled; another's from ``draws`` draws."""
    if isinstance(p, torch.distributions.StudentT):
        dfs, which = p.df.unique(return_inverse=True)
        low, high = torch.distributions.StudentT(dfs).sample((draws,)).quantile(quartiles, dim=0)
        return (high - low)[which] * p.scale
    low, high = p.sample((draws,)).quantile(quartiles, dim=0)
    return high - low


def initial_width(p: torch.distributions.Distribution) -> torch.Tensor:
    """The per-element width a posterior starts at when it starts at its prior's: the standard deviation (an
    :class:`EmpiricalBayesNormal` prior's hyperprior mode, which its scale starts from), expanded to the shape.

    Examples
    --------
    >>> initial_width(FanInNormal().distribution((2, 4), fan_in=4))
    tensor([[0.5000, 0.5000, 0.5000, 0.5000],
            [0.5000, 0.5000, 0.5000, 0.5000]])
    >>> float(initial_width(EmpiricalBayesNormal(gain=2.0).distribution((3,), fan_in=4)).max())
    1.0
    """
    base = strip_independent(p)
    shape = p.batch_shape + p.event_shape
    if isinstance(base, EmpiricalBayesNormalDistribution):
        return base.mode_scale.expand(shape)
    return torch.as_tensor(prior_std(base)).expand(shape)


def _as_pyro_distribution(d: torch.distributions.Distribution) -> dist.Distribution:
    """A plain ``torch.distributions`` object as Pyro's twin of the same class (Pyro's wrappers only add methods,
    such as ``to_event``, on top of the same state); an error naming the fix when Pyro has no twin."""
    if isinstance(d, dist.Distribution):
        return d
    twin = getattr(dist, type(d).__name__, None)
    if not (isinstance(twin, type) and issubclass(twin, type(d))):
        raise TypeError(
            f"prior {d!r} is a torch.distributions.{type(d).__name__}, which Pyro has no twin of; use a "
            "pyro.distributions distribution (e.g. pyro.distributions.Normal) or a pyro_bbb.priors prior."
        )
    converted = twin.__new__(twin)
    converted.__dict__.update(d.__dict__)
    return converted


#: The prior of a feed-forward or convolutional layer given none: ``Normal(0, sqrt(2 / fan_in))`` on every weight (He
#: et al.'s scale) and ``Normal(0, 1)`` on every bias. Chosen by the evidence (``benchmarks/evidence.py``,
#: ``benchmarks/README.md``): of the priors that are a density over the weights -- so that a layer stays a Pyro model
#: like any other, for every Pyro guide (AutoDelta, AutoDiagonalNormal, ...), ``Trace_ELBO``, NUTS and
#: ``poutine.condition`` -- it has the best training ELBO near the optimum on UCI concrete, energy and yacht and on a
#: 1-D regression (``FanInNormal()`` at gain 1 on UCI boston); N(0, 1), the old default, is the worst everywhere. The
#: empirical-Bayes :class:`EmpiricalBayesNormal`, whose scale is set from a Normal posterior, so that it has a KL but
#: no density, scored better still; pass it where :class:`pyro_bbb.ELBO` and a mean-field guide train the model.
#: Recurrent layers keep their own default (:data:`pyro_bbb.nn.DEFAULT_RECURRENT_PRIOR`).
DEFAULT_PRIOR = FanInNormal(gain=math.sqrt(2.0), bias_scale=1.0)


def as_prior(prior: Prior | dist.Distribution | None) -> Prior:
    """Normalise what a user passed as ``prior=``: ``None`` gives :data:`DEFAULT_PRIOR`.

    Examples
    --------
    >>> as_prior(None)
    FanInNormal(gain=1.4142135623730951, bias_scale=1.0)
    >>> as_prior(dist.Normal(0.0, 2.0))
    DistributionPrior(dist=Normal(loc: 0.0, scale: 2.0))
    """
    if prior is None:
        return DEFAULT_PRIOR
    if isinstance(prior, Prior):
        return prior
    if isinstance(prior, torch.distributions.Distribution):
        return DistributionPrior(_as_pyro_distribution(prior))
    raise TypeError(
        f"prior must be a pyro_bbb.priors.Prior (e.g. priors.Normal(0, 1)) or a pyro.distributions.Distribution, "
        f"got {type(prior).__name__}."
    )

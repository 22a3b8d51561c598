"""Moments of a network's activations: deterministic variational inference (Wu et al. 2019, diagonal dDVI).

Under :func:`pyro_bbb.moment_propagation` every Bayesian layer returns, instead of a sampled output, the mean
and variance its output has under the mean-field posterior: a :class:`Moments`. That object travels through
the user's ``forward`` like a tensor: activations (ReLU and leaky ReLU in closed form; tanh, sigmoid, softplus,
GELU and SiLU by Gauss-Hermite quadrature), deterministic ``nn.Linear`` / convolutions, shifts and scalings by
constants, indexing, ``view``/``reshape``/``flatten``, ``cat``/``stack`` and dropout in evaluation mode map the
two moments; anything else is a :class:`MomentPropagationError` that names the operation and the module calling
it. The likelihood then computes the *expected* log-likelihood in closed form (:class:`ExpectedNormal`), so the
ELBO has no Monte Carlo noise at all.

Every unit is treated as Gaussian and independent of the others (a diagonal covariance). For a network with one
hidden layer the output's mean and variance, and the expected Gaussian log-likelihood, are exact (the first layer's
pre-activations are independent Gaussians); deeper, the dropped covariances make it an approximation, and so do
convolutions followed by more layers (the positions of a feature map share one kernel draw, so they are correlated).
One covariance is kept: a Bayesian linear layer's output knows the covariance of its features
(:meth:`Moments.covariance`), which a heteroscedastic likelihood needs between the mean and the scale it reads off
one head.

Examples
--------
>>> m = Moments(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0]))
>>> out = torch.relu(m)
>>> out.mean                           # E[relu(x)] for x ~ N(0, 1) is 1/sqrt(2 pi)
tensor([0.3989, 1.0000])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .._internals import pyro_name

__all__ = [
    "Moments", "MomentPropagationError", "QUADRATURE_NODES", "gaussian_expectation", "standardized_expectations",
    "elementwise_moments", "relu_moments", "leaky_relu_moments", "affine_moments", "tracking_modules",
]

#: Gauss-Hermite nodes for smooth activations and a random noise scale: for tanh, the hardest, the mean and variance
#: are within 2e-4 / 0.3% of the exact ones up to a pre-activation standard deviation of 3 (1e-10 at 1).
QUADRATURE_NODES = 64


class MomentPropagationError(TypeError):
    """The network does something whose effect on a mean and a variance moment propagation cannot compute.

    Examples
    --------
    >>> torch.softmax(Moments(torch.zeros(2), torch.ones(2)), dim=-1)
    Traceback (most recent call last):
    ...
    pyro_bbb.nn.moments.MomentPropagationError: moment propagation cannot follow softmax: ...
    """


# -- which module is running (for the error message) -------------------------------------------------------------
_RUNNING: list[torch.nn.Module] = []


def _enter_module(module: torch.nn.Module, args: Any) -> None:
    _RUNNING.append(module)


def _leave_module(module: torch.nn.Module, args: Any, output: Any) -> None:
    if _RUNNING and _RUNNING[-1] is module:
        _RUNNING.pop()


@contextmanager
def tracking_modules() -> Iterator[None]:
    """Within the block, a :class:`MomentPropagationError` names the module whose ``forward`` raised it.

    Examples
    --------
    >>> net = torch.nn.Softmax(dim=-1)
    >>> with tracking_modules():
    ...     net(Moments(torch.zeros(2), torch.ones(2)))
    Traceback (most recent call last):
    ...
    pyro_bbb.nn.moments.MomentPropagationError: moment propagation cannot follow softmax in module Softmax: ...
    """
    depth = len(_RUNNING)
    before = torch.nn.modules.module.register_module_forward_pre_hook(_enter_module)
    after = torch.nn.modules.module.register_module_forward_hook(_leave_module)
    try:
        yield
    finally:
        before.remove()
        after.remove()
        del _RUNNING[depth:]


def _where() -> str:
    if not _RUNNING:
        return ""
    module = _RUNNING[-1]
    kind = type(module).__name__
    if kind.startswith("Pyro") and any(c.__name__ == kind[4:] for c in type(module).__mro__):
        kind = kind[4:]  # PyroModule[nn.Softmax] is a "PyroSoftmax": name the user's class
    name = pyro_name(module)
    return f" in module {name!r} ({kind})" if name else f" in module {kind}"


def _unsupported(what: str) -> MomentPropagationError:
    return MomentPropagationError(
        f"moment propagation cannot follow {what}{_where()}: it propagates means and variances through Bayesian and "
        "deterministic linear/convolutional layers and matrix products, ReLU, leaky ReLU, tanh, sigmoid, softplus, "
        "GELU, SiLU, shifts and scalings by constants, indexing, view/reshape/flatten, cat/stack and dropout in eval "
        "mode (see pyro_bbb.nn.moments). Train this network with estimator='flipout' (or 'local_reparam') instead."
    )


# -- the moments of elementwise functions ----------------------------------------------------------------------
@cache
def _hermite(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite.hermgauss(num_nodes)
    return nodes * math.sqrt(2.0), weights / math.sqrt(math.pi)  # for E[f(X)], X ~ N(0, 1)


def _quadrature_points(mean: torch.Tensor, variance: torch.Tensor, num_nodes: int):
    """The points ``mean + std * z``, their weights and the standard nodes ``z``, shaped (num_nodes, *mean.shape)."""
    nodes, weights = (torch.as_tensor(a, dtype=mean.dtype, device=mean.device) for a in _hermite(num_nodes))
    shape = (num_nodes,) + (1,) * mean.dim()
    nodes = nodes.reshape(shape)
    std = variance.clamp_min(torch.finfo(variance.dtype).tiny).sqrt()  # (a zero variance gets no infinite gradient)
    return mean + std * nodes, weights.reshape(shape), nodes


def gaussian_expectation(fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor, variance: torch.Tensor,
                         num_nodes: int = QUADRATURE_NODES) -> torch.Tensor:
    """``E[fn(X)]`` for independent ``X ~ Normal(mean, variance)`` elementwise, by Gauss-Hermite quadrature.

    Examples
    --------
    >>> gaussian_expectation(torch.exp, torch.tensor([0.0]), torch.tensor([1.0]))   # e^(1/2)
    tensor([1.6487])
    """
    points, weights, _ = _quadrature_points(mean, variance, num_nodes)
    return (weights * fn(points)).sum(0)


def standardized_expectations(fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor, variance: torch.Tensor,
                              num_nodes: int = QUADRATURE_NODES) -> tuple[torch.Tensor, ...]:
    """``E[fn(X)]``, ``E[fn(X) Z]`` and ``E[fn(X) Z^2]`` for ``X ~ Normal(mean, variance)`` and its standardised
    ``Z = (X - mean) / sqrt(variance)``, elementwise, by Gauss-Hermite quadrature (well defined at a zero variance,
    where they are ``fn(mean)``, ``0`` and ``fn(mean)``). A variable correlated with ``X`` is ``a + k Z + e`` with
    ``e`` independent of ``X``, so these three give its expectations weighted by ``fn(X)``.

    Examples
    --------
    >>> e0, e1, e2 = standardized_expectations(torch.exp, torch.tensor([0.0]), torch.tensor([1.0]))
    >>> torch.allclose(torch.stack([e0, e1, e2]), math.exp(0.5) * torch.tensor([[1.0], [1.0], [2.0]]))
    True
    """
    points, weights, nodes = _quadrature_points(mean, variance, num_nodes)
    weighted = weights * fn(points)
    return weighted.sum(0), (weighted * nodes).sum(0), (weighted * nodes.pow(2)).sum(0)


def elementwise_moments(fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor, variance: torch.Tensor,
                        num_nodes: int = QUADRATURE_NODES) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``fn(X)`` for ``X ~ Normal(mean, variance)`` (a smooth elementwise ``fn``), by
    Gauss-Hermite quadrature (the variance from centred values, so that it never comes out negative).

    Examples
    --------
    >>> m, v = elementwise_moments(torch.tanh, torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1e-12]))
    >>> abs(m[0].item()) < 1e-6, torch.allclose(m[1], torch.tanh(torch.tensor(2.0))), v[1].item() < 1e-12
    (True, True, True)
    """
    points, weights, _ = _quadrature_points(mean, variance, num_nodes)
    values = fn(points)
    out_mean = (weights * values).sum(0)
    return out_mean, (weights * (values - out_mean).pow(2)).sum(0)


def _normal_pdf_cdf(mean: torch.Tensor, variance: torch.Tensor):
    std = variance.clamp_min(torch.finfo(variance.dtype).tiny).sqrt()
    alpha = mean / std
    return std, torch.exp(-0.5 * alpha.pow(2)) / math.sqrt(2.0 * math.pi), torch.special.ndtr(alpha)


def relu_moments(mean: torch.Tensor, variance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``relu(X)`` for ``X ~ Normal(mean, variance)``, in closed form.

    With ``s`` the standard deviation, ``a = mean / s``, ``phi``/``Phi`` the standard Normal density/CDF:
    ``E = mean Phi(a) + s phi(a)`` and ``Var = mean^2 Phi(a) Phi(-a) + variance (Phi(a) - phi(a)^2)
    + mean s phi(a) (1 - 2 Phi(a))`` (written without the cancelling ``E[relu^2] - E^2``).

    Examples
    --------
    >>> m, v = relu_moments(torch.tensor([0.0]), torch.tensor([1.0]))
    >>> round(float(m), 4), round(float(v), 4)          # 1/sqrt(2 pi), 1/2 - 1/(2 pi)
    (0.3989, 0.3408)
    """
    return _relu_moments_and_cdf(mean, variance)[:2]


def _relu_moments_and_cdf(mean: torch.Tensor, variance: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`relu_moments` and ``Phi(mean / s)`` (which the leaky ReLU's covariance term also needs)."""
    std, pdf, cdf = _normal_pdf_cdf(mean, variance)
    out_mean = mean * cdf + std * pdf
    out_var = mean.pow(2) * cdf * (1 - cdf) + variance * (cdf - pdf.pow(2)) + mean * std * pdf * (1 - 2 * cdf)
    return out_mean, out_var.clamp_min(0), cdf


def leaky_relu_moments(mean: torch.Tensor, variance: torch.Tensor,
                       negative_slope: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``leaky_relu(X) = a X + (1 - a) relu(X)`` for ``X ~ Normal(mean, variance)``, in closed
    form (``Cov(X, relu(X)) = variance Phi(mean / s)`` by Stein's lemma).

    Examples
    --------
    >>> m, v = leaky_relu_moments(torch.tensor([0.0]), torch.tensor([1.0]), negative_slope=1.0)   # the identity
    >>> float(m), float(v)
    (0.0, 1.0)
    """
    a = negative_slope
    relu_mean, relu_var, cdf = _relu_moments_and_cdf(mean, variance)
    out_mean = a * mean + (1 - a) * relu_mean
    out_var = a**2 * variance + (1 - a) ** 2 * relu_var + 2 * a * (1 - a) * variance * cdf
    return out_mean, out_var.clamp_min(0)


def affine_moments(input: torch.Tensor | Moments, apply: Callable, weight_posterior: tuple[torch.Tensor, torch.Tensor],
                   bias_posterior: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                   linear: bool = False) -> Moments:
    """The moments of ``apply(x, W, b)`` (linear in ``W``, ``b`` and ``x``) for independent ``W ~ N(mu, sigma^2)``,
    ``b ~ N(mu_b, sigma_b^2)`` and inputs ``x`` with mean ``m`` and variance ``v`` (a plain tensor: ``v = 0``):
    mean ``apply(m, mu, mu_b)``, variance ``apply(m^2 + v, sigma^2, sigma_b^2) + apply(v, mu^2)``. Exact for any
    input distribution; the output's units are then treated as independent, except that with ``linear=True`` (``apply``
    is ``F.linear``: the weight's last dimension meets the input's) the result also answers
    :meth:`Moments.covariance` between two of its output features (a heteroscedastic head's mean and scale share
    their inputs, so they are correlated).

    Examples
    --------
    >>> x = torch.tensor([[1.0, 2.0]])
    >>> out = affine_moments(x, F.linear, (torch.ones(1, 2), torch.full((1, 2), 0.5)))
    >>> out.mean, out.variance                      # 1 + 2; 0.25 * (1 + 4)
    (tensor([[3.]]), tensor([[1.2500]]))
    """
    loc, scale = weight_posterior
    bias_loc, bias_var = (None, None) if bias_posterior is None else (bias_posterior[0], bias_posterior[1].pow(2))
    if isinstance(input, Moments):
        mean, variance = input.mean, input.variance
        out_var = apply(mean.pow(2) + variance, scale.pow(2), bias_var) + apply(variance, loc.pow(2), None)
    else:
        mean = input
        out_var = apply(mean.pow(2), scale.pow(2), bias_var)
    output = Moments(apply(mean, loc, bias_loc), out_var)
    if linear:
        output._linear_source = (input if isinstance(input, Moments) else None, loc)
    return output


# -- the tensor-like carrier ------------------------------------------------------------------------------------
def _parts(value: Any) -> tuple[Any, Any]:
    """(mean, variance) of a Moments, or (value, 0) for a constant."""
    if isinstance(value, Moments):
        return value.mean, value.variance
    if isinstance(value, torch.Tensor):
        return value, torch.zeros_like(value)
    return value, 0.0


def _same_map(fn: Callable, moments: Moments, *args, **kwargs) -> Moments:
    """A map that moves elements without mixing them (view, index, reshape): applied to both moments."""
    return Moments(fn(moments.mean, *args, **kwargs), fn(moments.variance, *args, **kwargs))


def _join(fn: Callable, values: Sequence, *args, **kwargs) -> Moments:
    """cat / stack of moments and constants."""
    means, variances = zip(*(_parts(v) for v in values), strict=True)
    return Moments(fn(means, *args, **kwargs), fn(variances, *args, **kwargs))


def _cat(values: Sequence, dim: int = 0) -> Moments:
    """cat; heads that read the same input (e.g. a heteroscedastic net's mean and scale layers) joined along their
    features keep their covariance: it is the covariance of one linear layer with their weights stacked."""
    output = _join(torch.cat, values, dim)
    sources = [getattr(v, "_linear_source", None) for v in values]
    if dim % output.dim() == output.dim() - 1 and all(sources) and all(s[0] is sources[0][0] for s in sources):
        output._linear_source = (sources[0][0], torch.cat([loc for _, loc in sources], 0))
    return output


def _one_moments(a: Any, b: Any, what: str) -> tuple[Moments, Any, bool]:
    """The Moments operand, the constant one, and whether the Moments came first."""
    if isinstance(a, Moments) and isinstance(b, Moments):
        raise _unsupported(
            f"{what} of two propagated activations (a residual or gating path: the result's variance needs their "
            "covariance, which diagonal propagation does not track)"
        )
    return (a, b, True) if isinstance(a, Moments) else (b, a, False)


def _add(a: Any, b: Any, alpha: float = 1.0) -> Moments:
    moments, constant, first = _one_moments(a, b, "a sum")
    if first:
        return Moments(moments.mean + alpha * constant, moments.variance)
    return Moments(constant + alpha * moments.mean, alpha**2 * moments.variance)


def _sub(a: Any, b: Any, alpha: float = 1.0) -> Moments:
    return _add(a, b, alpha=-alpha)


def _mul(a: Any, b: Any) -> Moments:
    moments, constant, _ = _one_moments(a, b, "a product")
    return Moments(moments.mean * constant, moments.variance * constant * constant)


def _div(a: Any, b: Any) -> Moments:
    if not isinstance(a, Moments) or isinstance(b, Moments):
        raise _unsupported("a division by a propagated activation")
    return Moments(a.mean / b, a.variance / (b * b))


def _matmul(a: Any, b: Any) -> Moments:
    moments, constant, first = _one_moments(a, b, "a matrix product")
    if first:
        return Moments(moments.mean @ constant, moments.variance @ constant.pow(2))
    return Moments(constant @ moments.mean, constant.pow(2) @ moments.variance)


def _linear(input: Moments, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Moments:
    return Moments(F.linear(input.mean, weight, bias), F.linear(input.variance, weight.pow(2)))


def _conv(conv: Callable) -> Callable:
    def rule(input: Moments, weight: torch.Tensor, bias: torch.Tensor | None = None, *args, **kwargs) -> Moments:
        return Moments(conv(input.mean, weight, bias, *args, **kwargs),
                       conv(input.variance, weight.pow(2), None, *args, **kwargs))
    return rule


def _dropout(input: Moments, p: float = 0.5, training: bool = True, inplace: bool = False) -> Moments:
    if training and p > 0:
        raise _unsupported("dropout in training mode (its random mask is not a Gaussian weight)")
    return input


def _relu(input: Moments, inplace: bool = False) -> Moments:
    return Moments(*relu_moments(input.mean, input.variance))


def _leaky_relu(input: Moments, negative_slope: float = 0.01, inplace: bool = False) -> Moments:
    return Moments(*leaky_relu_moments(input.mean, input.variance, negative_slope))


def _smooth(fn: Callable) -> Callable:
    def rule(input: Moments, *args, **kwargs) -> Moments:
        return Moments(*elementwise_moments(lambda x: fn(x, *args, **kwargs), input.mean, input.variance))
    return rule


_SHAPE_FUNCTIONS = (torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, torch.transpose, torch.permute,
                    torch.movedim, torch.narrow, torch.select)
_SMOOTH_FUNCTIONS = (torch.tanh, torch.sigmoid, F.softplus, F.gelu, F.silu)


def _shape(fn: Callable) -> Callable:
    def rule(input: Moments, *args, **kwargs) -> Moments:
        return _same_map(fn, input, *args, **kwargs)
    return rule


_RULES: dict[Callable, Callable] = {
    **{fn: _shape(fn) for fn in _SHAPE_FUNCTIONS},
    **{fn: _smooth(fn) for fn in _SMOOTH_FUNCTIONS},
    torch.cat: lambda values, *a, **k: _cat(values, *a, **k),
    torch.concat: lambda values, *a, **k: _cat(values, *a, **k),
    torch.stack: lambda values, *a, **k: _join(torch.stack, values, *a, **k),
    torch.add: _add, torch.Tensor.__add__: _add, torch.Tensor.__radd__: lambda a, b: _add(b, a),
    torch.sub: _sub, torch.Tensor.__sub__: _sub, torch.Tensor.__rsub__: lambda a, b: _sub(b, a),
    torch.mul: _mul, torch.Tensor.__mul__: _mul, torch.Tensor.__rmul__: _mul,
    torch.div: _div, torch.Tensor.__truediv__: _div, torch.Tensor.__rtruediv__: lambda a, b: _div(b, a),
    torch.matmul: _matmul, torch.Tensor.__matmul__: _matmul, torch.Tensor.__rmatmul__: lambda a, b: _matmul(b, a),
    torch.neg: lambda input: Moments(-input.mean, input.variance),
    F.linear: _linear, F.conv1d: _conv(F.conv1d), F.conv2d: _conv(F.conv2d), F.conv3d: _conv(F.conv3d),
    torch.relu: _relu, F.relu: _relu, F.leaky_relu: _leaky_relu,
    F.dropout: _dropout, F.dropout1d: _dropout, F.dropout2d: _dropout, F.dropout3d: _dropout,
}


def _name(func: Callable) -> str:
    return getattr(func, "__name__", None) or repr(func)


class Moments:
    """Mean and variance of a tensor of activations, treated as independent Gaussians: what a network passes on
    under :func:`pyro_bbb.infer.estimators.moment_propagation`. It answers torch's functions through
    ``__torch_function__`` (see the module's docstring for the ones it follows) and has the tensor methods a
    ``forward`` commonly uses; every other operation is a :class:`MomentPropagationError`, never a silent result.

    Parameters
    ----------
    mean, variance : torch.Tensor
        Of the same shape.

    Examples
    --------
    >>> m = Moments(torch.zeros(4, 3), torch.ones(4, 3))
    >>> m[:, -1].shape, m.view(2, 6).shape, (2 * m + 1).variance[0, 0]
    (torch.Size([4]), torch.Size([2, 6]), tensor(4.))
    """

    __slots__ = ("mean", "variance", "_linear_source")

    def __init__(self, mean: torch.Tensor, variance: torch.Tensor):
        if mean.shape != variance.shape:
            variance = variance.expand(mean.shape) if variance.dim() <= mean.dim() else variance
        self.mean, self.variance = mean, variance
        self._linear_source = None  # (its input Moments or None, weight mean) when straight out of a linear layer

    def covariance(self, i: int, j: int) -> torch.Tensor | None:
        """The covariance of features ``i`` and ``j`` (of the last dimension), where it is known: for the output of
        a Bayesian linear layer under moment propagation, ``sum_k mu_ik mu_jk v_k`` over its inputs' variances ``v``
        (independent weights add nothing off the diagonal), also for such outputs of layers that read the same input
        joined by ``torch.cat`` along the features; ``None`` after any other operation, where the diagonal
        propagation treats the features as independent.

        Examples
        --------
        >>> hidden = Moments(torch.zeros(1, 2), torch.tensor([[1.0, 4.0]]))
        >>> out = affine_moments(hidden, F.linear, (torch.tensor([[1.0, 1.0], [1.0, -1.0]]), torch.zeros(2, 2)),
        ...                      linear=True)
        >>> out.covariance(0, 1), out.covariance(0, 0), (out + 1).covariance(0, 1)   # 1 - 4; the variance; unknown
        (tensor([-3.]), tensor([5.]), None)
        """
        if self._linear_source is None:
            return None
        if i % self.shape[-1] == j % self.shape[-1]:
            return self.variance[..., i]
        input, loc = self._linear_source
        if input is None:  # a plain input: only independent weights and biases vary
            return torch.zeros_like(self.mean[..., i])
        return (input.variance * (loc[i] * loc[j])).sum(-1)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        rule = _RULES.get(func)
        if func is torch.broadcast_tensors:  # what a distribution does with its parameters
            raise MomentPropagationError(
                f"the network's output reached a distribution{_where()}, but under moment propagation it is a mean and "
                "a variance (pyro_bbb.nn.moments.Moments): observe it through a pyro_bbb likelihood, e.g. "
                "`pyro_bbb.likelihoods.Gaussian(scale)(output, y)`, which computes the expected log-likelihood."
            )
        if rule is None:
            raise _unsupported(_name(func))
        return rule(*args, **(kwargs or {}))

    # -- what a tensor tells about itself
    shape = property(lambda self: self.mean.shape)
    dtype = property(lambda self: self.mean.dtype)
    device = property(lambda self: self.mean.device)
    ndim = property(lambda self: self.mean.dim())

    def is_floating_point(self) -> bool:
        return self.mean.is_floating_point()

    def dim(self) -> int:
        return self.mean.dim()

    def size(self, dim: int | None = None):
        return self.mean.size() if dim is None else self.mean.size(dim)

    def numel(self) -> int:
        return self.mean.numel()

    def __len__(self) -> int:
        return len(self.mean)

    # -- maps that move elements
    def __getitem__(self, index) -> Moments:
        return _same_map(torch.Tensor.__getitem__, self, index)

    def view(self, *shape) -> Moments:
        return _same_map(torch.Tensor.view, self, *shape)

    def reshape(self, *shape) -> Moments:
        return _same_map(torch.Tensor.reshape, self, *shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Moments:
        return _same_map(torch.flatten, self, start_dim, end_dim)

    def squeeze(self, *dim) -> Moments:
        return _same_map(torch.Tensor.squeeze, self, *dim)

    def unsqueeze(self, dim: int) -> Moments:
        return _same_map(torch.unsqueeze, self, dim)

    def transpose(self, dim0: int, dim1: int) -> Moments:
        return _same_map(torch.transpose, self, dim0, dim1)

    def permute(self, *dims) -> Moments:
        return _same_map(torch.Tensor.permute, self, *dims)

    def contiguous(self) -> Moments:
        return _same_map(torch.Tensor.contiguous, self)

    def to(self, *args, **kwargs) -> Moments:
        return _same_map(torch.Tensor.to, self, *args, **kwargs)

    # -- arithmetic with constants and activations
    def __add__(self, other) -> Moments:
        return _add(self, other)

    def __radd__(self, other) -> Moments:
        return _add(other, self)

    def __sub__(self, other) -> Moments:
        return _sub(self, other)

    def __rsub__(self, other) -> Moments:
        return _sub(other, self)

    def __mul__(self, other) -> Moments:
        return _mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other) -> Moments:
        return _div(self, other)

    def __rtruediv__(self, other) -> Moments:
        return _div(other, self)

    def __matmul__(self, other) -> Moments:
        return _matmul(self, other)

    def __rmatmul__(self, other) -> Moments:
        return _matmul(other, self)

    def __neg__(self) -> Moments:
        return Moments(-self.mean, self.variance)

    def relu(self) -> Moments:
        return _relu(self)

    def tanh(self) -> Moments:
        return _RULES[torch.tanh](self)

    def sigmoid(self) -> Moments:
        return _RULES[torch.sigmoid](self)

    def __getattr__(self, name: str):
        raise AttributeError(
            f"moment propagation cannot follow Tensor.{name}{_where()}: the activations here are a mean and a "
            f"variance (pyro_bbb.nn.moments.Moments), and {name} has no rule for them. Train this network with "
            "estimator='flipout' (or 'local_reparam') instead."
        )

    def __repr__(self) -> str:
        return f"Moments(mean={self.mean!r}, variance={self.variance!r})"


# -- the expected log-likelihood --------------------------------------------------------------------------------

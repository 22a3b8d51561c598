"""Likelihoods: how a network's output becomes the distribution of the observed targets.

A likelihood is a small :class:`~pyro.nn.PyroModule` called as ``likelihood(output, y)``. It checks the targets,
draws its own global parameters (e.g. a learned noise scale) outside the data plate and emits the observation
inside ``pyro.plate("data")``, which is where :class:`pyro_bbb.ELBO` scales a minibatch to the full data set. It
also knows how to summarise predictive samples (:meth:`Likelihood.prediction`).

The network's output always keeps its feature dimension: ``(*sample_dims, batch, features)``.

Examples
--------
>>> likelihood = Categorical()
>>> trace = poutine.trace(likelihood).get_trace(torch.randn(4, 3), torch.tensor([0, 2, 1, 1]))
>>> trace.nodes["y"]["fn"].batch_shape, trace.nodes["y"]["cond_indep_stack"][0].name
(torch.Size([4]), 'data')
"""

from __future__ import annotations

import math
from numbers import Real

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample

from ._draws import known_output_batch
from ._inputs import as_tensor, targets_like
from ._plates import DATA_PLATE
from .distributions import ExpectedNormal
from .nn.moments import MomentPropagationError, Moments, gaussian_expectation, standardized_expectations
from .prediction.results import ClassificationPrediction, Prediction, RegressionPrediction, prediction_for

__all__ = ["TargetError", "Likelihood", "Gaussian", "HeteroscedasticGaussian", "Categorical", "Bernoulli"]

#: The fix for a network run on one input without its batch dimension (its output lacks the batch's).
_ONE_INPUT = "for a single input pass a batch of one, x[None] (x.unsqueeze(0))"


def _check_finite_targets(y: torch.Tensor) -> None:
    if y.is_floating_point() and not bool(torch.isfinite(y).all()):
        bad = int((~torch.isfinite(y)).sum())
        raise ValueError(f"the targets y contain {bad} NaN or infinite value(s); remove or impute them before fitting.")


class TargetError(ValueError):
    """The targets do not fit the likelihood or the network's output (raised inside the model, so that
    :func:`pyro_bbb.fit` can tell a bad batch from a failing model and restore the parameters).

    Examples
    --------
    >>> issubclass(TargetError, ValueError)
    True
    """


class Likelihood(PyroModule):
    """Base class. Subclasses implement :meth:`distribution` and :meth:`prediction`, and may refine
    :meth:`check_targets`; those with a closed-form expected log-likelihood implement :meth:`moment_distribution`
    (training with :func:`pyro_bbb.infer.estimators.moment_propagation`).

    Parameters
    ----------
    name : str
        Name of the observation site (``"y"``).

    Examples
    --------
    >>> class Poisson(Likelihood):
    ...     def distribution(self, output):
    ...         return dist.Poisson(output.squeeze(-1).exp())
    >>> Poisson()
    Poisson(site='y')
    """

    #: Whether the targets are real numbers (a bool ``y`` is then refused by name, not left to torch)
    real_valued = False

    def __init__(self, name: str = "y"):
        super().__init__()
        self.site = name

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        """The distribution of the targets given the network's ``output``; batch shape ``(*sample_dims, batch)``."""
        raise NotImplementedError

    def moment_distribution(self, output: Moments) -> dist.Distribution:
        """Under moment propagation: a distribution whose ``log_prob(y)`` is ``E[log p(y | f)]`` for an output ``f``
        with the given means and variances (independent Gaussians); batch shape as :meth:`distribution`'s."""
        raise MomentPropagationError(
            f"{type(self).__name__} has no closed-form expected log-likelihood, so moment propagation cannot train "
            "it (Gaussian and HeteroscedasticGaussian have one). Use estimator='flipout' or 'local_reparam'."
        )

    def check_targets(self, y: torch.Tensor) -> torch.Tensor:
        """Validate the targets on their own (dtype, values); returns them in the dtype the distribution wants."""
        y = as_tensor(y, "the targets y")
        _check_finite_targets(y)
        if self.real_valued and y.dtype == torch.bool:  # (torch's Normal said only "Subtraction ... with a bool")
            raise ValueError(f"{type(self).__name__} models real-valued targets, and y is bool: for yes/no labels "
                             "use likelihoods.Bernoulli(); for the numbers 0 and 1, y.float().")
        return y

    def prediction(self, distribution: dist.Distribution, samples: torch.Tensor) -> Prediction:
        """Summarise ``distribution`` (batch ``(S, batch)``: one member per weight draw) and predictive samples: by
        default the result kind of its family (:func:`~pyro_bbb.prediction.results.prediction_for`)."""
        return prediction_for(distribution, samples)

    def forward(self, output: torch.Tensor, y: torch.Tensor | None = None, data_plate: str = DATA_PLATE,
                num_data: int | None = None) -> torch.Tensor:
        """Emit the observation inside ``pyro.plate(data_plate, B)``; with ``num_data`` the plate is declared over the
        whole training set, ``pyro.plate(data_plate, num_data, subsample=range(B))``, so it scales the batch's
        log-likelihood by ``num_data / B`` for any Pyro ELBO.

        Examples
        --------
        >>> site = poutine.trace(Gaussian(1.0)).get_trace(torch.zeros(4, 1), torch.zeros(4), num_data=100).nodes["y"]
        >>> site["scale"], site["cond_indep_stack"][0].full_size
        (25.0, 100)
        """
        fn, y = self.observation(output, y)
        rows = fn.batch_shape[-1] if fn.batch_shape else 1
        if num_data is None:
            plate = pyro.plate(data_plate, rows, dim=-1)
        else:
            indices = torch.arange(rows, device=None if y is None else y.device)  # the batch: only its size matters
            plate = pyro.plate(data_plate, num_data, subsample=indices, dim=-1)
        with plate:
            return pyro.sample(self.site, fn, obs=y)

    def observation(self, output: torch.Tensor, y: torch.Tensor | None = None):
        """The distribution the observation site gets for ``output`` and the checked targets (``None`` stays
        ``None``) in the shape it observes; what :meth:`forward` emits inside the data plate.

        Examples
        --------
        >>> fn, y = Gaussian(0.1).observation(torch.zeros(3, 1), torch.ones(3, 1))   # (N, 1) targets accepted
        >>> fn.batch_shape, y.shape
        (torch.Size([3]), torch.Size([3]))
        """
        fn = self.moment_distribution(output) if isinstance(output, Moments) else self.distribution(output)
        if y is not None:
            try:
                y = self.check_targets(y)
                expected = fn.batch_shape[-1:] + fn.event_shape
                y = targets_like(y, expected)  # (N, 1) targets for N scalar outputs: torch's MSELoss convention
                if tuple(y.shape) != tuple(expected):
                    one_hot = (y.dim() == len(expected) + 1 and y.shape[:-1] == expected and y.shape[-1] > 1
                               and bool(((y == 0) | (y == 1)).all()) and bool((y.sum(-1) == 1).all()))
                    if output.dim() > 2:  # (fn's batch would be its leading dims: "needs (T, D)" misled)
                        raise ValueError(
                            f"the network's output has shape {tuple(output.shape)}, and {type(self).__name__} reads "
                            f"an output as (batch, {output.shape[-1]}): one row per datum. A dimension between (a "
                            "value per position of a sequence) is not a datum of its own: end the network with one "
                            "output per row (a sequence's last position, out[:, -1]), or put the positions into the "
                            "rows (reshape the inputs, or the output and y, to (batch * positions, ...))."
                        )
                    if (not isinstance(output, Moments) and output.dim() >= 2 and len(fn.batch_shape) >= 2
                            and tuple(fn.batch_shape[-2:]) == tuple(output.shape[-2:])):
                        raise ValueError(
                            f"{type(self).__name__}.distribution gave a batch shape {tuple(fn.batch_shape)}, the "
                            f"network's output shape {tuple(output.shape)}: its last dimension is each row's, not a "
                            "datum of its own. Return one member per row: squeeze a single output (output.squeeze(-1))"
                            ", or score a row's outputs together with .to_event(1)."
                        )
                    raise ValueError(
                        f"the targets y have shape {tuple(y.shape)} but the network's output {tuple(output.shape)} "
                        f"under {type(self).__name__} needs targets of shape {tuple(expected)}: x and y must have "
                        "the same number of rows, and one target per row."
                        + (" These look like one-hot rows: pass the class labels, y.argmax(-1)." if one_hot else "")
                    )
                self._check_against_output(y, fn)
            except (ValueError, TypeError) as error:
                raise TargetError(str(error)) from None
        return fn, y

    def _check_against_output(self, y: torch.Tensor, fn: dist.Distribution) -> None:
        """Checks that need the output (e.g. a class label beyond the number of logits)."""

    def _squeeze_single_output(self, output: torch.Tensor) -> torch.Tensor:
        if output.dim() < 2 or output.shape[-1] != 1:
            raise ValueError(
                f"{type(self).__name__} expects the network to output shape (batch, 1), got {tuple(output.shape)}."
            )
        return output.squeeze(-1)

    def extra_repr(self) -> str:
        return f"site={self.site!r}"


def _per_datum(family, *params: torch.Tensor) -> dist.Distribution:
    """``family(*params)`` with one member per datum: a datum's D outputs are one event (D > 1), or the output's
    feature dimension is dropped (D = 1)."""
    params = torch.broadcast_tensors(*params)
    if params[0].shape[-1] > 1:
        return family(*params).to_event(1)
    return family(*(p.squeeze(-1) for p in params))


class Gaussian(Likelihood):
    """``y ~ Normal(output, scale)`` with a fixed ``scale``, or a learned homoscedastic one (``scale=None``).

    A learned scale is a latent site ``"<name>.scale"`` (``"likelihood.scale"`` inside :class:`pyro_bbb.BNN`)
    with prior ``LogNormal(log(prior_median), 1)``; the guide learns its posterior like any weight's. The network
    outputs ``(batch, 1)`` for scalar targets ``y`` of shape ``(batch,)``, or ``(batch, D)`` for targets of shape
    ``(batch, D)`` (independent dimensions, one shared scale).

    Parameters
    ----------
    scale : float, optional
        Fixed noise standard deviation; ``None`` learns it.
    prior_median : float
        Median of the learned scale's prior (``1.0`` suits standardised targets).

    Examples
    --------
    >>> Gaussian(scale=0.1)
    Gaussian(site='y', scale=0.1)
    >>> Gaussian().distribution(torch.zeros(5, 1)).batch_shape
    torch.Size([5])
    """

    real_valued = True

    def __init__(self, scale: float | None = None, *, prior_median: float = 1.0, name: str = "y"):
        super().__init__(name)
        if scale is not None and (not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0):
            raise ValueError(f"`scale` must be a finite number > 0 (or None to learn it), got {scale!r}.")
        if not isinstance(prior_median, Real) or not math.isfinite(prior_median) or prior_median <= 0:
            raise ValueError(f"`prior_median` must be a finite number > 0, got {prior_median!r}.")
        self.fixed_scale = None if scale is None else float(scale)
        self.prior_median = float(prior_median)
        if scale is None:
            # A buffer gives the prior the device and dtype of the model after `.to(...)`.
            self.register_buffer("_log_median", torch.tensor(math.log(prior_median)), persistent=False)
            self.scale = PyroSample(lambda self: dist.LogNormal(self._log_median, torch.ones_like(self._log_median)))

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        return _per_datum(dist.Normal, output, self._scale_like(output))

    def moment_distribution(self, output: Moments) -> dist.Distribution:
        """``E[log Normal(y | f, scale)] = log Normal(y | mean, scale) - variance / (2 scale^2)``.

        Examples
        --------
        >>> fn = Gaussian(scale=0.5).moment_distribution(Moments(torch.zeros(3, 1), torch.ones(3, 1)))
        >>> fn.batch_shape
        torch.Size([3])
        """
        scale = self._scale_like(output)
        return _per_datum(ExpectedNormal, output.mean, output.variance, scale.log(), scale.pow(-2))

    def _scale_like(self, output) -> torch.Tensor:
        if output.dim() < 2:
            raise ValueError(f"Gaussian expects the network to output (batch, D), got shape {tuple(output.shape)}: "
                             f"{_ONE_INPUT}; for scalar targets the network ends in one output, (batch, 1).")
        scale = self.fixed_scale if self.fixed_scale is not None else self.scale
        if isinstance(scale, torch.Tensor) and scale.dim():  # draws (*S, 1) line up with (*S, batch, D)
            scale = scale.unsqueeze(-1)
        return torch.as_tensor(scale, dtype=output.dtype, device=output.device)

    def prediction(self, distribution, samples):
        return RegressionPrediction(distribution, samples)

    def extra_repr(self) -> str:
        scale = self.fixed_scale if self.fixed_scale is not None else f"learned, prior_median={self.prior_median}"
        return f"{super().extra_repr()}, scale={scale}"


class HeteroscedasticGaussian(Likelihood):
    """``y ~ Normal(mean, softplus(raw) + min_scale)`` where the network outputs ``(batch, 2)``: mean and raw scale.

    Train it with ``fit(..., estimator="moments", lr_final=lr / 10)``. A constant learning rate keeps moving the
    predictions by more than the learned noise once that is small, and with Monte Carlo estimators the noise of the
    weight draws reaches the scale head too and can make training run away. Moment propagation observes the
    expected log-likelihood exactly; with the decaying rate it trains smoothly on all nine UCI sets
    (``benchmarks/README.md``).

    Parameters
    ----------
    min_scale : float
        Floor on the noise standard deviation (keeps the likelihood finite when the net pushes the scale to 0).

    Examples
    --------
    >>> fn = HeteroscedasticGaussian().distribution(torch.tensor([[1.0, 0.0]]))
    >>> round(float(fn.loc), 3), round(float(fn.scale), 3)
    (1.0, 0.694)
    """

    real_valued = True

    def __init__(self, min_scale: float = 1e-3, *, name: str = "y"):
        super().__init__(name)
        if not isinstance(min_scale, Real) or not math.isfinite(min_scale) or min_scale < 0:
            raise ValueError(f"`min_scale` must be a finite number >= 0, got {min_scale!r}.")
        self.min_scale = float(min_scale)

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        self._check_output(output)
        return dist.Normal(output[..., 0], self._scale(output[..., 1]))

    def moment_distribution(self, output: Moments) -> dist.Distribution:
        """``E[log Normal(y | f, s(r))]`` over the Gaussian mean ``f`` and raw scale ``r``: ``E[log s]``, ``E[1/s^2]``
        and, where the two are correlated, ``E[(f - E f) / s^2]`` and ``E[(f - E f)^2 / s^2]``, by Gauss-Hermite
        quadrature over ``r``. ``f`` and ``r`` out of one Bayesian linear layer share its inputs, so they covary
        (:meth:`pyro_bbb.nn.moments.Moments.covariance`, exact after one hidden layer); writing ``f`` as
        ``E f + k Z + e`` with ``Z`` the standardised ``r`` and ``k = cov(f, r) / sd(r)`` makes the expectation
        exact for jointly Gaussian ``(f, r)`` with those moments (their Gaussian shape is the approximation moment
        propagation makes for every unit). Outputs whose covariance was not tracked (built by further operations
        after the last layer) are treated as independent, the diagonal approximation.

        Examples
        --------
        >>> output = Moments(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]]))
        >>> fn = HeteroscedasticGaussian().moment_distribution(output)
        >>> torch.allclose(fn.expected_log_scale, HeteroscedasticGaussian().distribution(output.mean).scale.log())
        True
        """
        self._check_output(output)
        mean, variance = output.mean, output.variance
        raw_mean, raw_var = mean[..., 1], variance[..., 1]
        expected_log_scale = gaussian_expectation(lambda r: self._scale(r).log(), raw_mean, raw_var)
        precision, precision_z, precision_z2 = standardized_expectations(
            lambda r: self._scale(r).pow(-2), raw_mean, raw_var
        )
        covariance = output.covariance(0, 1)
        if covariance is None:
            return ExpectedNormal(mean[..., 0], variance[..., 0], expected_log_scale, precision)
        # f = E f + k Z + e, e independent of r with variance var(f) - k^2; |k| <= sd(f) (Cauchy-Schwarz), clamped
        # against rounding
        tiny = torch.finfo(raw_var.dtype).tiny
        sd = variance[..., 0].clamp_min(tiny).sqrt()
        slope = torch.minimum(torch.maximum(covariance / raw_var.clamp_min(tiny).sqrt(), -sd), sd)
        residual = (variance[..., 0] - slope.pow(2)).clamp_min(0)
        return ExpectedNormal(mean[..., 0], variance[..., 0], expected_log_scale, precision,
                              deviation_precision=slope * precision_z,
                              variance_precision=slope.pow(2) * precision_z2 + residual * precision)

    def _scale(self, raw: torch.Tensor) -> torch.Tensor:
        return F.softplus(raw) + self.min_scale

    def _check_output(self, output) -> None:
        if output.dim() < 2 or output.shape[-1] != 2:
            raise ValueError(
                "HeteroscedasticGaussian expects the network to output (batch, 2): the mean and the raw scale, got "
                f"shape {tuple(output.shape)}."
            )

    def prediction(self, distribution, samples):
        return RegressionPrediction(distribution, samples)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, min_scale={self.min_scale}"


def _check_integer_labels(y: torch.Tensor, name: str) -> None:
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(
            f"{name} needs integer class labels (dtype torch.long), got dtype {y.dtype}; convert them with "
            "`y.long()` (a torch tensor) or `y.astype(int)` (a numpy array)."
        )


class Categorical(Likelihood):
    """``y ~ Categorical(logits=output)``: the network outputs ``(batch, num_classes)`` logits; ``y`` holds integer
    labels in ``[0, num_classes)``.

    Examples
    --------
    >>> Categorical().distribution(torch.zeros(4, 10)).batch_shape
    torch.Size([4])
    >>> Categorical().check_targets(torch.tensor([0.0, 1.0]))
    Traceback (most recent call last):
    ...
    ValueError: Categorical needs integer class labels (dtype torch.long), got dtype torch.float32; ...
    """

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        if output.dim() < 2:
            raise ValueError(
                f"Categorical expects logits of shape (batch, num_classes), got shape {tuple(output.shape)}: "
                f"{_ONE_INPUT}; for a net with one output per input use likelihoods.Bernoulli()."
            )
        return dist.Categorical(logits=output)

    def check_targets(self, y):
        y = super().check_targets(y)
        _check_integer_labels(y, "Categorical")
        if y.numel() and int(y.min()) < 0:
            raise ValueError(f"class labels must be >= 0, got a label {int(y.min())}.")
        return y

    def _check_against_output(self, y, fn):
        num_classes = fn.logits.shape[-1]
        if y.numel() and int(y.max()) >= num_classes:
            raise ValueError(
                f"a class label is {int(y.max())} but the network outputs {num_classes} logits (labels must lie in "
                f"[0, {num_classes})); give the last layer one output per class."
            )

    def prediction(self, distribution, samples):
        return ClassificationPrediction(distribution, samples)


class Bernoulli(Likelihood):
    """``y ~ Bernoulli(logits=output)``: the network outputs ``(batch, 1)`` or ``(batch,)`` logits (as
    ``torch.nn.BCEWithLogitsLoss`` takes them); ``y`` holds 0/1 (or bool).

    Examples
    --------
    >>> Bernoulli().check_targets(torch.tensor([0, 1, 1]))
    tensor([0., 1., 1.])
    """

    def distribution(self, output: torch.Tensor) -> dist.Distribution:
        # (batch,) logits: nothing after the rows, also when weight draws lead, (S, batch), inside pyro_bbb.BNN
        rows_only = output.dim() == 1 or tuple(output.shape) == known_output_batch()
        return dist.Bernoulli(logits=output if rows_only else self._squeeze_single_output(output))

    def check_targets(self, y):
        y = super().check_targets(y)
        if y.dtype == torch.bool:
            return y.float()
        if y.numel() and not bool(((y == 0) | (y == 1)).all()):
            raise ValueError("Bernoulli needs binary targets (0/1 or bool); found other values.")
        # (half-precision 0/1 targets: the log-likelihood in float32 at least, as N / B scales it past float16's range)
        return y if y.is_floating_point() and torch.finfo(y.dtype).bits >= 32 else y.float()

    def prediction(self, distribution, samples):
        return ClassificationPrediction(distribution, samples)

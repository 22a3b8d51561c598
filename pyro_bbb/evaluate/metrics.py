"""Metrics of predictive quality: log-likelihood, RMSE, accuracy, calibration, Brier score, interval coverage.

Each metric takes a :class:`~pyro_bbb.prediction.Prediction` (from :func:`pyro_bbb.predict`) or the plain tensor
it needs (predictive means, class probabilities) and the targets, and returns a Python float.

Examples
--------
>>> probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
>>> y = torch.tensor([0, 1, 1])
>>> round(accuracy(probs, y), 3), round(brier_score(probs, y), 3)
(0.667, 0.273)
"""

from __future__ import annotations

import torch

from .._checks import check_count
from ..data._inputs import targets_of_shape
from ..prediction.results import ClassificationPrediction, Prediction, RegressionPrediction

__all__ = [
    "log_likelihood",
    "rmse",
    "accuracy",
    "expected_calibration_error",
    "brier_score",
    "interval_coverage",
]


def _class_probs(prediction: ClassificationPrediction | torch.Tensor) -> torch.Tensor:
    """Class probabilities ``(batch, C)``; binary ``(batch,)`` probabilities become two columns."""
    probs = prediction.probs if isinstance(prediction, ClassificationPrediction) else prediction
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"expected a ClassificationPrediction or a probability tensor, got {type(probs).__name__}.")
    if probs.dim() == 1:
        probs = torch.stack([1 - probs, probs], -1)
    return probs


def log_likelihood(prediction: Prediction, y: torch.Tensor, reduction: str = "mean") -> float | torch.Tensor:
    """Log posterior predictive density ``log (1/S) sum_s p(y_i | x_i, w_s)`` per datum, averaged by default.

    ``reduction="none"`` returns the per-datum tensor, ``"sum"`` the total.

    Examples
    --------
    >>> p = Prediction(dist.Normal(torch.zeros(2, 3), 1.0), torch.zeros(2, 3))
    >>> round(log_likelihood(p, torch.zeros(3)), 4)     # log N(0 | 0, 1)
    -0.9189
    """
    if not isinstance(prediction, Prediction):
        raise TypeError(f"log_likelihood needs a Prediction from pyro_bbb.predict, got {type(prediction).__name__}.")
    y = targets_of_shape(y, prediction.samples.shape[1:])
    per_datum = prediction.log_likelihood(y)
    if reduction == "none":
        return per_datum
    if reduction == "sum":
        return float(per_datum.sum())
    if reduction == "mean":
        return float(per_datum.mean())
    raise ValueError(f'`reduction` must be "mean", "sum" or "none", got {reduction!r}.')


def rmse(prediction: RegressionPrediction | torch.Tensor, y: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean.

    Examples
    --------
    >>> rmse(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 3.0]))
    0.7071067690849304
    """
    mean = prediction.mean if isinstance(prediction, RegressionPrediction) else prediction
    y = targets_of_shape(y, mean.shape)
    return float((mean - y).pow(2).mean().sqrt())


def accuracy(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of inputs whose most probable class is the label.

    Examples
    --------
    >>> accuracy(torch.tensor([0.9, 0.2]), torch.tensor([1, 1]))    # binary: P(y = 1)
    0.5
    """
    probs = _class_probs(prediction)
    y = targets_of_shape(y, probs.shape[:1])
    return float((probs.argmax(-1) == y.long()).float().mean())


def expected_calibration_error(
    prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor, num_bins: int = 10
) -> float:
    """Expected calibration error with ``num_bins`` equal-width confidence bins (Guo et al. 2017).

    ``ECE = sum_b |B_b| / n * |accuracy(B_b) - confidence(B_b)|`` where the confidence is the top class probability.

    Examples
    --------
    >>> probs = torch.tensor([[0.8, 0.2]] * 5)
    >>> round(expected_calibration_error(probs, torch.tensor([0, 0, 0, 0, 1])), 6)   # 80% sure, 80% right
    0.0
    """
    check_count("num_bins", num_bins)
    probs = _class_probs(prediction)
    y = targets_of_shape(y, probs.shape[:1])
    confidence, predicted = probs.max(-1)
    correct = (predicted == y.long()).to(probs.dtype)
    bins = (confidence * num_bins).long().clamp(max=num_bins - 1)
    count = torch.zeros(num_bins, dtype=probs.dtype).index_add_(0, bins, torch.ones_like(confidence))
    gap = torch.zeros(num_bins, dtype=probs.dtype).index_add_(0, bins, correct - confidence)
    return float(gap.abs().sum() / confidence.shape[0]) if count.sum() else 0.0


def brier_score(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor) -> float:
    """Mean over inputs of ``sum_c (p_c - 1[y = c])^2`` (0 is perfect, 2 is worst).

    Examples
    --------
    >>> brier_score(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    2.0
    """
    probs = _class_probs(prediction)
    y = targets_of_shape(y, probs.shape[:1])
    one_hot = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).to(probs.dtype)
    return float((probs - one_hot).pow(2).sum(-1).mean())


def interval_coverage(
    prediction: RegressionPrediction | tuple[torch.Tensor, torch.Tensor], y: torch.Tensor, level: float = 0.9
) -> float:
    """Fraction of targets inside the central predictive interval of probability ``level``.

    ``prediction`` is a :class:`~pyro_bbb.prediction.RegressionPrediction` or a ``(lower, upper)`` pair.

    Examples
    --------
    >>> interval_coverage((torch.zeros(4), torch.ones(4)), torch.tensor([0.5, 0.2, 2.0, -1.0]))
    0.5
    """
    if isinstance(prediction, RegressionPrediction):
        lower, upper = prediction.interval(level)
    else:
        lower, upper = prediction
    y = targets_of_shape(y, lower.shape)
    return float(((y >= lower) & (y <= upper)).float().mean())

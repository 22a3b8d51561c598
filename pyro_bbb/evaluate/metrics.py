"""Metrics of predictive quality -- log-likelihood, RMSE, accuracy, calibration (equal-width, equal-mass and
per-class bins), Brier score, interval coverage -- and of what a prediction's uncertainty buys: out-of-distribution
detection and selective prediction.

Each metric takes a :class:`~pyro_bbb.prediction.Prediction` (from :func:`pyro_bbb.predict`) or the plain tensor
it needs (predictive means, class probabilities, uncertainty scores) and the targets, and returns a Python float.
The uncertainty metrics read a *score* -- higher means less sure -- from a prediction (:func:`uncertainty_score`:
``"entropy"``, ``"mutual_information"``, ``"max_probability"`` (one minus the top class probability) for a
classifier, ``"std"`` for a regression; each metric's default fits the prediction it is given, :func:`default_score`)
or take the scores as a tensor. Detection treats the out-of-distribution inputs as positives and equals
scikit-learn's ``roc_auc_score``, ``average_precision_score`` and ``roc_curve`` (ties included; tested to 1e-6).

Examples
--------
>>> probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
>>> y = torch.tensor([0, 1, 1])
>>> round(accuracy(probs, y), 3), round(brier_score(probs, y), 3)
(0.667, 0.273)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._checks import check_count
from .._inputs import as_tensor, class_labels, targets_of_shape
from ..prediction.results import ClassificationPrediction, Prediction, RegressionPrediction

__all__ = [
    "log_likelihood",
    "rmse",
    "accuracy",
    "expected_calibration_error",
    "brier_score",
    "interval_coverage",
    "class_probabilities", "SCORES", "default_score", "uncertainty_score", "ood_auroc", "ood_aupr", "fpr_at_tpr",
    "risk_coverage", "aurc", "risk_at_coverage", "adaptive_calibration_error", "classwise_calibration_error",
    "labelled_probabilities",
]


def class_probabilities(prediction: ClassificationPrediction | torch.Tensor,
                        caller: str = "class_probabilities") -> torch.Tensor:
    """Class probabilities ``(batch, C)`` of a classifier's prediction or of a probability tensor; binary ``(batch,)``
    or ``(batch, 1)`` probabilities of class 1 (a sigmoid's output) become two columns. A tensor that does not hold
    probabilities (logits, log probabilities: every calibration number of them would be wrong) is a ``ValueError``
    naming ``caller``.

    Examples
    --------
    >>> class_probabilities(torch.tensor([0.25, 1.0]))
    tensor([[0.7500, 0.2500],
            [0.0000, 1.0000]])
    >>> class_probabilities(torch.tensor([[0.25], [1.0]]))      # one column: P(y = 1), as above
    tensor([[0.7500, 0.2500],
            [0.0000, 1.0000]])
    >>> class_probabilities(torch.tensor([[2.0, -1.0]]))          # logits
    Traceback (most recent call last):
    ...
    ValueError: class_probabilities reads a plain tensor as class probabilities (in [0, 1], ...
    """
    if isinstance(prediction, ClassificationPrediction):
        probs = prediction.probs
    elif isinstance(prediction, torch.Tensor):
        probs = prediction
    else:
        raise TypeError(f"{caller} needs a ClassificationPrediction from pyro_bbb.predict or a probability tensor, got "
                        f"{_got(prediction)}.")
    if probs.dim() == 2 and probs.shape[-1] == 1:  # a one-class softmax would be 1 everywhere: a sigmoid's column
        probs = probs.squeeze(-1)
    if probs.dim() == 1:
        probs = torch.stack([1 - probs, probs], -1)
    if not isinstance(prediction, ClassificationPrediction):
        total = probs.sum(-1)
        tolerance = max(1e-4, 16 * torch.finfo(probs.dtype).eps) if probs.is_floating_point() else 1e-4  # (float16)
        if not bool(((probs >= 0) & (probs <= 1)).all() and torch.allclose(total, torch.ones_like(total),
                                                                           atol=tolerance)):
            raise ValueError(
                f"{caller} reads a plain tensor as class probabilities (in [0, 1], each row summing to 1; a binary "
                "classifier's P(y = 1) in [0, 1]), and these are not: for logits pass logits.softmax(-1) (binary: "
                "logits.sigmoid()); for a regression pass the Prediction from pyro_bbb.predict (a mean alone has no "
                "density)."
            )
    return probs


def log_likelihood(prediction: Prediction | torch.Tensor, y: torch.Tensor,
                   reduction: str = "mean") -> float | torch.Tensor:
    """Log posterior predictive density ``log (1/S) sum_s p(y_i | x_i, w_s)`` per datum, averaged by default.

    ``prediction`` is what :func:`pyro_bbb.predict` returns, or a classifier's predictive class probabilities
    ``(batch, C)`` (``(batch,)``: a Bernoulli's P(y = 1)), whose log at the label is the same number. A classifier's
    labels may be integer, boolean, float 0/1 or one-hot. ``reduction="none"`` returns the per-datum tensor,
    ``"sum"`` the total.

    Examples
    --------
    >>> p = Prediction(dist.Normal(torch.zeros(2, 3), 1.0), torch.zeros(2, 3))
    >>> round(log_likelihood(p, torch.zeros(3)), 4)     # log N(0 | 0, 1)
    -0.9189
    >>> round(log_likelihood(torch.tensor([[0.5, 0.5], [0.9, 0.1]]), torch.tensor([1, 0])), 4)
    -0.3993
    """
    if isinstance(prediction, Prediction):
        per_datum = prediction.log_likelihood(y)  # a classifier's reads its labels with class_labels
    elif isinstance(prediction, torch.Tensor):
        probs, y = _probs_and_labels(prediction, y, "log_likelihood")
        per_datum = probs.gather(-1, y[:, None]).squeeze(-1).log().to(prediction.dtype)
    else:
        raise TypeError(f"log_likelihood needs a Prediction from pyro_bbb.predict (or a classifier's class "
                        f"probabilities), got {_got(prediction)}.")
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
    _require_regression(prediction, "rmse")
    if not isinstance(prediction, RegressionPrediction | torch.Tensor):
        raise TypeError(f"rmse takes a RegressionPrediction from pyro_bbb.predict or a tensor of predictive means, got "
                        f"{_got(prediction)}.")
    mean = prediction.mean if isinstance(prediction, RegressionPrediction) else prediction
    targets = as_tensor(y, "y")  # (a clear error for a list, before the hint below reads it)
    rows = targets.shape[0] if targets.dim() else 0
    if isinstance(prediction, torch.Tensor) and mean.dim() >= 2 and mean.shape[0] != rows == mean.shape[1]:
        raise ValueError(f"rmse reads a tensor as one predictive mean per input, and this one has shape "
                         f"{tuple(mean.shape)} for {rows} targets: draws first, as predictive samples are? Pass "
                         "their mean, samples.mean(0), or pyro_bbb.predict's prediction.")
    return float((mean - targets_of_shape(targets, mean.shape)).pow(2).mean().sqrt())


def _got(prediction: Any) -> str:
    """What a metric was given instead of a prediction, for its error: the type, and the fix for Pyro's own
    ``Predictive`` output (a dict of sample sites)."""
    if isinstance(prediction, dict):
        return ("a dict (of sample sites, as pyro.infer.Predictive returns?): pass pyro_bbb.predict(model, guide, x), "
                "which every metric takes")
    return type(prediction).__name__


def _require_regression(prediction, metric: str) -> None:
    """A clear error for a classifier's prediction given to a regression metric."""
    if isinstance(prediction, ClassificationPrediction):
        raise TypeError(f"{metric} is a regression metric and this is a classifier's prediction; a classifier is "
                        "scored by accuracy, log_likelihood, expected_calibration_error or brier_score.")


def accuracy(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of inputs whose most probable class is the label.

    Examples
    --------
    >>> accuracy(torch.tensor([0.9, 0.2]), torch.tensor([1, 1]))    # binary: P(y = 1)
    0.5
    """
    probs, y = _probs_and_labels(prediction, y, "accuracy")
    return float((probs.argmax(-1) == y).float().mean())


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
    probs, y = labelled_probabilities(prediction, y, "expected_calibration_error")
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).to(probs.dtype)
    bins = (confidence * num_bins).long().clamp(max=num_bins - 1)
    count = confidence.new_zeros(num_bins).index_add_(0, bins, torch.ones_like(confidence))  # (on its device)
    gap = confidence.new_zeros(num_bins).index_add_(0, bins, correct - confidence)
    return float(gap.abs().sum() / confidence.shape[0]) if count.sum() else 0.0


def brier_score(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor) -> float:
    """Mean over inputs of ``sum_c (p_c - 1[y = c])^2`` (0 is perfect, 2 is worst).

    Examples
    --------
    >>> brier_score(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    2.0
    """
    probs, y = labelled_probabilities(prediction, y, "brier_score")
    one_hot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(probs.dtype)
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
    _require_regression(prediction, "interval_coverage")
    if isinstance(prediction, RegressionPrediction):
        lower, upper = prediction.interval(level)
    elif (isinstance(prediction, tuple | list) and len(prediction) == 2
          and all(isinstance(bound, torch.Tensor) for bound in prediction)):
        lower, upper = prediction
    else:
        raise TypeError(f"interval_coverage takes a RegressionPrediction from pyro_bbb.predict or a (lower, upper) "
                        f"pair of tensors, got {_got(prediction)}.")
    y = targets_of_shape(y, lower.shape)
    return float(((y >= lower) & (y <= upper)).float().mean())


# -- what the uncertainty buys ---------------------------------------------------------------------------
#: The kinds of uncertainty score a prediction gives.
SCORES = ("entropy", "mutual_information", "max_probability", "std")


def default_score(prediction: Prediction | torch.Tensor, selective: bool = False) -> str:
    """The score a metric reads from ``prediction`` when none is named: ``"std"`` for a regression; for a classifier
    ``"entropy"`` (out-of-distribution detection), or ``"max_probability"`` with ``selective=True`` (selective
    prediction, which keeps the inputs whose predicted class is surest); ``"score"`` for a tensor of scores.

    Examples
    --------
    >>> default_score(torch.tensor([0.1, 0.3]))
    'score'
    """
    if isinstance(prediction, RegressionPrediction):
        return "std"
    if isinstance(prediction, ClassificationPrediction):
        return "max_probability" if selective else "entropy"
    return "score"


def uncertainty_score(prediction: Prediction | torch.Tensor, score: str | None = None) -> torch.Tensor:
    """Per-input uncertainty (higher: less sure) of ``prediction``; a tensor is taken as the scores themselves.
    ``score=None`` reads :func:`default_score`'s: the predictive entropy of a classifier, the std of a regression.

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.5, 0.5]]])   # one draw, two inputs
    >>> p = ClassificationPrediction(dist.Categorical(probs=probs), torch.zeros(1, 2))
    >>> uncertainty_score(p, "max_probability")
    tensor([0.1000, 0.5000])
    """
    if isinstance(prediction, torch.Tensor):
        if prediction.dim() > 2 or (prediction.dim() == 2 and prediction.shape[-1] != 1):
            raise ValueError(
                f"a tensor is read as one uncertainty score per input, (N,) or (N, 1), got shape "
                f"{tuple(prediction.shape)} (class probabilities?): pass the Prediction from pyro_bbb.predict, or a "
                "score per input such as its predictive_entropy."
            )
        return prediction.detach().reshape(-1)
    if not isinstance(prediction, Prediction):
        raise TypeError(f"expected a Prediction from pyro_bbb.predict or a tensor of scores, got {_got(prediction)}.")
    score = default_score(prediction) if score is None else score
    if score not in SCORES:
        raise ValueError(f"`score` must be one of {SCORES}, got {score!r}.")
    if isinstance(prediction, ClassificationPrediction):
        if score == "std":
            raise ValueError('score="std" is for a regression; a classifier has "entropy", "mutual_information" and '
                             '"max_probability".')
        if score == "max_probability":
            probs = prediction.probs
            top = torch.maximum(probs, 1 - probs) if prediction.binary else probs.max(-1).values
            return (1 - top).detach()
        value = prediction.predictive_entropy if score == "entropy" else prediction.mutual_information
        return value.detach()
    if isinstance(prediction, RegressionPrediction):
        if score != "std":
            raise ValueError(f'score={score!r} is for a classifier; a regression prediction has score="std".')
        return prediction.std.detach().reshape(prediction.std.shape[0], -1).mean(-1)
    raise TypeError(f"uncertainty scores are for a classifier's or a regression's Prediction, got "
                    f"{type(prediction).__name__}.")


def _detection_arrays(inside, outside, score: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of both sets (float64, one dimension) and labels (1: out of distribution)."""
    scores_in = uncertainty_score(inside, score).to(torch.float64).reshape(-1)
    scores_out = uncertainty_score(outside, score).to(torch.float64).reshape(-1)
    if scores_in.numel() == 0 or scores_out.numel() == 0:
        raise ValueError("out-of-distribution detection needs at least one in-distribution and one "
                         "out-of-distribution input.")
    if not (torch.isfinite(scores_in).all() and torch.isfinite(scores_out).all()):
        raise ValueError("the uncertainty scores hold NaN or infinite values.")
    scores = torch.cat([scores_in, scores_out])
    labels = torch.cat([torch.zeros_like(scores_in), torch.ones_like(scores_out)])
    return scores, labels


def _curve(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative true and false positives at each distinct score, from the highest down (as ``roc_curve``)."""
    order = torch.argsort(scores, descending=True, stable=True)
    scores, labels = scores[order], labels[order]
    last_of_each = torch.ones_like(scores, dtype=torch.bool)
    last_of_each[:-1] = scores[1:] != scores[:-1]
    tps = labels.cumsum(0)[last_of_each]
    fps = (1 - labels).cumsum(0)[last_of_each]
    return tps, fps


def ood_auroc(inside: Prediction | torch.Tensor, outside: Prediction | torch.Tensor,
              score: str | None = None) -> float:
    """Area under the ROC curve of telling ``outside`` (positive) from ``inside`` by the score: the probability that
    an out-of-distribution input scores higher than an in-distribution one (ties count one half). 0.5 is chance.

    Examples
    --------
    >>> ood_auroc(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.2]))
    0.875
    """
    scores, labels = _detection_arrays(inside, outside, score)
    tps, fps = _curve(scores, labels)
    tpr = torch.cat([tps.new_zeros(1), tps / tps[-1]])
    fpr = torch.cat([fps.new_zeros(1), fps / fps[-1]])
    return float(torch.trapezoid(tpr, fpr))


def ood_aupr(inside: Prediction | torch.Tensor, outside: Prediction | torch.Tensor,
             score: str | None = None) -> float:
    """Average precision of finding ``outside`` (positive) among both sets by the score, as scikit-learn's
    ``average_precision_score``: ``sum_k (recall_k - recall_{k-1}) precision_k`` over the distinct scores.

    Examples
    --------
    >>> ood_aupr(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.4]))
    1.0
    """
    scores, labels = _detection_arrays(inside, outside, score)
    tps, fps = _curve(scores, labels)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    steps = torch.diff(torch.cat([recall.new_zeros(1), recall]))
    return float((steps * precision).sum())


def fpr_at_tpr(inside: Prediction | torch.Tensor, outside: Prediction | torch.Tensor, score: str | None = None,
               tpr: float = 0.95) -> float:
    """The fraction of in-distribution inputs flagged (false positive rate) at the highest threshold that flags at
    least ``tpr`` of the out-of-distribution ones: "FPR at 95% TPR" by default. Lower is better.

    Examples
    --------
    >>> fpr_at_tpr(torch.tensor([0.1, 0.2, 0.5, 0.6]), torch.tensor([0.3, 0.7]), tpr=0.95)
    0.5
    """
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"`tpr` must lie in (0, 1], got {tpr!r}.")
    scores, labels = _detection_arrays(inside, outside, score)
    tps, fps = _curve(scores, labels)
    reached = torch.nonzero(tps / tps[-1] >= tpr - 1e-12)[0, 0]
    return float(fps[reached] / fps[-1])


def _confidence_and_error(prediction, y, score: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-input uncertainty and loss: 0/1 error of the most probable class, or squared error of the mean."""
    if not isinstance(prediction, Prediction):
        raise TypeError(f"selective prediction needs a Prediction from pyro_bbb.predict, got {_got(prediction)}.")
    if score is None:
        score = default_score(prediction, selective=True)
    uncertainty = uncertainty_score(prediction, score).to(torch.float64)
    if isinstance(prediction, ClassificationPrediction):
        y = class_labels(y, len(prediction), prediction.num_classes).to(prediction.predicted_class.device)
        error = (prediction.predicted_class != y).to(torch.float64)
    elif isinstance(prediction, RegressionPrediction):
        y = targets_of_shape(y, prediction.mean.shape).to(prediction.mean.device)
        error = (prediction.mean - y).pow(2).reshape(y.shape[0], -1).mean(-1).to(torch.float64)
    else:  # (a Prediction of neither kind: a custom likelihood's)
        raise TypeError(f"selective prediction needs a classifier's or a regression's Prediction from "
                        f"pyro_bbb.predict, got {type(prediction).__name__}.")
    return uncertainty, error.detach()


def risk_coverage(prediction: Prediction, y: torch.Tensor, score: str | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Selective prediction: keep the ``k`` surest inputs (lowest score) and report the risk among them, for every
    ``k``. Returns ``(coverage k / n, risk)``; the risk is the error rate (classification) or the mean squared error
    (regression) of the kept inputs. Ties in the score are kept in input order. The score defaults to
    ``"max_probability"`` for a classifier and ``"std"`` for a regression.

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]]])
    >>> p = ClassificationPrediction(dist.Categorical(probs=probs), torch.zeros(1, 3))
    >>> coverage, risk = risk_coverage(p, torch.tensor([0, 1, 1]))
    >>> risk.tolist()
    [0.0, 0.0, 0.3333333333333333]
    """
    uncertainty, error = _confidence_and_error(prediction, y, score)
    order = torch.argsort(uncertainty, stable=True)
    kept = torch.arange(1, error.numel() + 1, dtype=torch.float64, device=error.device)
    return kept / error.numel(), error[order].cumsum(0) / kept


def aurc(prediction: Prediction, y: torch.Tensor, score: str | None = None) -> float:
    """Area under the risk-coverage curve (the mean of the risk over the coverages ``1/n, ..., 1``); lower is better.

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]]])
    >>> p = ClassificationPrediction(dist.Categorical(probs=probs), torch.zeros(1, 3))
    >>> round(aurc(p, torch.tensor([0, 1, 1])), 4)
    0.1111
    """
    return float(risk_coverage(prediction, y, score)[1].mean())


def risk_at_coverage(prediction: Prediction, y: torch.Tensor, coverage: float = 0.8,
                     score: str | None = None) -> float:
    """The risk when only the surest ``coverage`` fraction of the inputs is predicted (at least one input).

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]]])
    >>> p = ClassificationPrediction(dist.Categorical(probs=probs), torch.zeros(1, 3))
    >>> risk_at_coverage(p, torch.tensor([0, 1, 1]), coverage=0.67)
    0.0
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"`coverage` must lie in (0, 1], got {coverage!r}.")
    covered, risk = risk_coverage(prediction, y, score)
    count = math.floor(coverage * covered.numel() + 1e-9)  # (0.29 * 100 is 28.999...: 29 inputs, not 28)
    return float(risk[max(count, 1) - 1])


def labelled_probabilities(prediction: ClassificationPrediction | torch.Tensor, y,
                           caller: str = "labelled_probabilities") -> tuple[torch.Tensor, torch.Tensor]:
    """Class probabilities ``(batch, C)`` (:func:`class_probabilities`) and the labels as ``long`` ``(batch,)`` on
    their device, whatever form the labels take (integer, boolean, float 0 / 1, ``(batch, 1)``, one-hot, numpy).

    Examples
    --------
    >>> labelled_probabilities(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([[0.0], [1.0]]))[1]
    tensor([0, 1])
    """
    probs = class_probabilities(prediction, caller)
    return probs, class_labels(y, probs.shape[0], probs.shape[-1]).to(probs.device)


def _probs_and_labels(prediction, y, caller: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`labelled_probabilities` in float64, detached."""
    probs, y = labelled_probabilities(prediction, y, caller)
    return probs.detach().to(torch.float64), y


def adaptive_calibration_error(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor,
                               num_bins: int = 15) -> float:
    """Expected calibration error over ``num_bins`` bins of equal mass (Nixon et al. 2019): the inputs sorted by
    confidence (the top class probability) and cut into bins of (nearly) equal counts, ``sum_b |B_b| / n
    |accuracy(B_b) - confidence(B_b)|``.

    Examples
    --------
    >>> probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    >>> round(adaptive_calibration_error(probs, torch.tensor([0, 0, 0, 1]), num_bins=2), 4)
    0.1
    """
    check_count("num_bins", num_bins)
    probs, y = _probs_and_labels(prediction, y, "adaptive_calibration_error")
    confidence, predicted = probs.max(-1)
    order = torch.argsort(confidence, stable=True)
    correct = (predicted == y).to(torch.float64)[order]
    confidence = confidence[order]
    total = 0.0
    for part in torch.tensor_split(torch.arange(confidence.numel(), device=confidence.device), num_bins):
        if part.numel():
            total += float((correct[part] - confidence[part]).sum().abs())
    return total / confidence.numel()


def classwise_calibration_error(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor,
                                num_bins: int = 15) -> float:
    """Calibration of every class probability, not only the top one (Kull et al. 2019): for each class ``c``, the
    equal-width binned gap between ``p_c`` and the frequency of ``y = c``, averaged over the classes.

    Examples
    --------
    >>> probs = torch.tensor([[0.75, 0.25]] * 4)
    >>> round(classwise_calibration_error(probs, torch.tensor([0, 0, 0, 1])), 6)
    0.0
    """
    check_count("num_bins", num_bins)
    probs, y = _probs_and_labels(prediction, y, "classwise_calibration_error")
    one_hot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(torch.float64)
    bins = (probs * num_bins).long().clamp(max=num_bins - 1)
    per_class = []
    for c in range(probs.shape[-1]):
        gap = torch.zeros(num_bins, dtype=torch.float64, device=probs.device)
        gap.index_add_(0, bins[:, c], one_hot[:, c] - probs[:, c])
        per_class.append(gap.abs().sum() / probs.shape[0])
    return float(torch.stack(per_class).mean())

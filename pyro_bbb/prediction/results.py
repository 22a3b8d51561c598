"""The posterior predictive's results: :class:`Prediction` and its regression and classification kinds (moments,
intervals, the entropy decomposition of uncertainty). :func:`pyro_bbb.predict` (in
:mod:`pyro_bbb.prediction.predictive`) makes them.

Examples
--------
>>> p = RegressionPrediction(dist.Normal(torch.tensor([[0.0], [2.0]]), 1.0), torch.zeros(2, 1))
>>> p.mean, p.epistemic_std
(tensor([1.]), tensor([1.]))
"""

from __future__ import annotations

import copy
import math
from numbers import Integral
from typing import Any

import numpy as np
import pyro.distributions as dist
import torch

from .._inputs import class_labels, targets_of_shape
from ..priors import strip_independent

__all__ = ["Prediction", "RegressionPrediction", "ClassificationPrediction", "prediction_for"]


class Prediction:
    """Posterior predictive of a batch of inputs: one likelihood per weight draw, and predictive samples.

    Attributes
    ----------
    distribution : Distribution
        The likelihood under each weight draw; batch shape ``(S, batch)``.
    samples : Tensor
        One predictive draw of the targets per weight draw, shape ``(S, batch, *event)``.

    Examples
    --------
    >>> p = Prediction(dist.Normal(torch.zeros(4, 2), 1.0), torch.zeros(4, 2))
    >>> p.num_samples, len(p)
    (4, 2)
    """

    def __init__(self, distribution: dist.Distribution, samples: torch.Tensor):
        self.distribution = distribution
        self.samples = samples

    @property
    def num_samples(self) -> int:
        """Number of weight draws S."""
        return self.distribution.batch_shape[0]

    def __len__(self) -> int:
        return self.distribution.batch_shape[1]

    def __getitem__(self, rows: Any) -> Prediction:
        """The prediction of some of the inputs, the same draws: ``rows`` indexes the batch as a tensor's first
        dimension does (a slice, an index tensor or list, a boolean mask; an integer keeps a batch of one).

        Examples
        --------
        >>> p = Prediction(dist.Normal(torch.arange(6.0).view(2, 3), 1.0), torch.zeros(2, 3))
        >>> len(p[1:]), len(p[torch.tensor([True, False, True])]), len(p[0])
        (2, 2, 1)
        """
        index = torch.as_tensor(rows) if isinstance(rows, torch.Tensor | np.ndarray) else None
        if isinstance(rows, Integral) or (index is not None and index.dim() == 0 and index.dtype != torch.bool
                                          and not index.is_floating_point()):
            rows = [int(rows)]  # (numpy and 0-dim integer tensors too)
        subset = copy.copy(self)
        subset.distribution, subset.samples = _select_rows(self.distribution, rows), self.samples[:, rows]
        return subset

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``log p(y | x, w_s)`` for every draw s and datum: shape ``(S, batch)`` (``(batch, 1)`` targets of scalar
        predictions are read as ``(batch,)``; integer 0/1 labels of a Bernoulli are read as its float values)."""
        y = targets_of_shape(y, self.samples.shape[1:]).to(self.samples.device)
        if self.samples.is_floating_point() and not y.is_floating_point():
            y = y.to(self.samples.dtype)
        return self.distribution.log_prob(y)

    def log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """Log posterior predictive density per datum: ``log mean_s p(y | x, w_s)``, shape ``(batch,)``."""
        return torch.logsumexp(self.log_prob(y), 0) - math.log(self.num_samples)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_samples={self.num_samples}, batch={len(self)})"


def _select_rows(distribution: dist.Distribution, rows: Any) -> dist.Distribution:
    """``distribution`` (batch ``(S, batch, ...)``) at some rows of its batch."""
    if isinstance(distribution, dist.Independent):
        return _select_rows(distribution.base_dist, rows).to_event(distribution.reinterpreted_batch_ndims)
    if isinstance(distribution, dist.Normal):
        return dist.Normal(distribution.loc[:, rows], distribution.scale[:, rows])
    if isinstance(distribution, dist.Categorical | dist.Bernoulli):
        return type(distribution)(logits=distribution.logits[:, rows])
    raise TypeError(f"a prediction over a {type(distribution).__name__} cannot be indexed by rows (Normal, "
                    "Categorical and Bernoulli can).")


def _normal_parts(distribution: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    base = strip_independent(distribution)
    return base.loc, base.scale


class RegressionPrediction(Prediction):
    """Prediction under a Gaussian likelihood: moments and intervals of the Gaussian mixture over weight draws.

    Examples
    --------
    >>> loc = torch.tensor([[0.0], [2.0]])              # two weight draws, one input
    >>> p = RegressionPrediction(dist.Normal(loc, 1.0), loc)
    >>> p.mean, p.epistemic_std, p.aleatoric_std
    (tensor([1.]), tensor([1.]), tensor([1.]))
    >>> [round(float(t), 3) for t in p.interval(0.9)]
    [-1.284, 3.284]
    """

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean: the mean of the network's mean over draws."""
        return _normal_parts(self.distribution)[0].mean(0)

    @property
    def epistemic_std(self) -> torch.Tensor:
        """Standard deviation of the network's mean across weight draws (model uncertainty)."""
        return _normal_parts(self.distribution)[0].std(0, correction=0)

    @property
    def aleatoric_std(self) -> torch.Tensor:
        """Root mean noise variance across draws (data noise)."""
        return _normal_parts(self.distribution)[1].pow(2).mean(0).sqrt()

    @property
    def std(self) -> torch.Tensor:
        """Total predictive standard deviation: ``sqrt(epistemic^2 + aleatoric^2)``."""
        return (self.epistemic_std.pow(2) + self.aleatoric_std.pow(2)).sqrt()

    def quantile(self, q: float) -> torch.Tensor:
        """The ``q``-quantile of the predictive mixture, per datum (bisection on its CDF, to 1e-6 of the range)."""
        if not 0 < q < 1:
            raise ValueError(f"a quantile level must lie strictly between 0 and 1, got {q!r}.")
        loc, scale = _normal_parts(self.distribution)
        dtype = loc.dtype
        loc, scale = loc.double(), scale.double()
        lower = (loc - 10 * scale).min(0).values
        upper = (loc + 10 * scale).max(0).values
        for _ in range(int(math.ceil(math.log2(1e6))) + 2):
            mid = (lower + upper) / 2
            below = torch.special.ndtr((mid - loc) / scale).mean(0) < q
            lower, upper = torch.where(below, mid, lower), torch.where(below, upper, mid)
        return ((lower + upper) / 2).to(dtype)

    def interval(self, level: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
        """Central predictive interval holding probability ``level``: ``(lower, upper)``."""
        if not 0 < level < 1:
            raise ValueError(f"`level` must lie strictly between 0 and 1, got {level!r}.")
        return self.quantile((1 - level) / 2), self.quantile((1 + level) / 2)


def _entropy(probs: torch.Tensor, binary: bool) -> torch.Tensor:
    if binary:
        probs = torch.stack([1 - probs, probs], -1)
    return -(probs * probs.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum(-1)


class ClassificationPrediction(Prediction):
    """Prediction under a Categorical or Bernoulli likelihood, with the entropy decomposition of uncertainty.

    ``predictive_entropy = expected_entropy (aleatoric) + mutual_information (epistemic)``.

    Examples
    --------
    >>> logits = torch.tensor([[[2.0, -2.0]], [[-2.0, 2.0]]])   # two draws that disagree about one input
    >>> p = ClassificationPrediction(dist.Categorical(logits=logits), torch.zeros(2, 1))
    >>> p.probs
    tensor([[0.5000, 0.5000]])
    >>> round(float(p.mutual_information), 2), round(float(p.expected_entropy), 2)
    (0.6, 0.09)
    """

    @property
    def binary(self) -> bool:
        return isinstance(self.distribution, dist.Bernoulli)

    @property
    def num_classes(self) -> int:
        """The number of classes (2 for a Bernoulli)."""
        return 2 if self.binary else self.draw_probs.shape[-1]

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``log p(y | x, w_s)``, shape ``(S, batch)``, for labels that are integer, boolean, float 0/1 (``(batch,)``
        or ``(batch, 1)``) or one-hot rows; a clear error for probabilities, fractions or labels out of range."""
        return super().log_prob(class_labels(y, len(self), self.num_classes))

    @property
    def draw_probs(self) -> torch.Tensor:
        """Class probabilities under each draw: ``(S, batch, C)`` (``(S, batch)`` for Bernoulli: P(y = 1))."""
        return self.distribution.probs

    @property
    def probs(self) -> torch.Tensor:
        """Predictive class probabilities: ``(batch, C)`` (``(batch,)`` for Bernoulli)."""
        return self.draw_probs.mean(0)

    @property
    def predicted_class(self) -> torch.Tensor:
        """The most probable class per input."""
        return (self.probs > 0.5).long() if self.binary else self.probs.argmax(-1)

    @property
    def predictive_entropy(self) -> torch.Tensor:
        """Entropy of the predictive probabilities (total uncertainty), nats."""
        return _entropy(self.probs, self.binary)

    @property
    def expected_entropy(self) -> torch.Tensor:
        """Mean entropy of each draw's probabilities (aleatoric uncertainty), nats."""
        return _entropy(self.draw_probs, self.binary).mean(0)

    @property
    def mutual_information(self) -> torch.Tensor:
        """Mutual information between the label and the weights (epistemic uncertainty), nats."""
        return (self.predictive_entropy - self.expected_entropy).clamp_min(0)


def prediction_for(distribution: dist.Distribution, samples: torch.Tensor) -> Prediction:
    """The result kind for a stacked likelihood: :class:`RegressionPrediction` for a Normal,
    :class:`ClassificationPrediction` for a Categorical or Bernoulli, else a plain :class:`Prediction`; a classifier
    gives one label per row: a Categorical or Bernoulli reinterpreted over several
    labels per row (``.to_event``: tokens, multi-label) is a ``ValueError`` (its scores would read them wrongly).

    Examples
    --------
    >>> type(prediction_for(dist.Categorical(logits=torch.zeros(2, 3, 4)), torch.zeros(2, 3))).__name__
    'ClassificationPrediction'
    """
    base = strip_independent(distribution)
    if isinstance(base, dist.Normal):
        return RegressionPrediction(distribution, samples)
    if base is not distribution and isinstance(base, dist.Categorical | dist.Bernoulli):
        raise ValueError(
            f"predict scores one class label per row, but this model's observation is a {type(base).__name__} over "
            f"{tuple(distribution.event_shape)} labels per row (.to_event or a plate inside the data plate: tokens, "
            "or several labels), which its "
            "classification results would read wrongly. Give each label its own row of the data plate, or draw "
            "per-label predictions with Pyro's Predictive."
        )
    if not isinstance(base, dist.Categorical | dist.Bernoulli):  # (a Poisson, a StudentT, ...: summarised as itself)
        return Prediction(distribution, samples)
    return ClassificationPrediction(*_one_label_per_row(distribution, samples))


def _one_label_per_row(distribution: dist.Distribution, samples: torch.Tensor
                       ) -> tuple[dist.Distribution, torch.Tensor]:
    """A stacked Categorical or Bernoulli of batch shape ``(S, N, 1, ...)`` (the data plate at ``dim=-2``, one label
    per row with a trailing dimension of size 1, a common Pyro idiom) as one of batch shape ``(S, N)``, and its
    samples alike: the metrics read each row's class probabilities off the last dimension."""
    shape = distribution.batch_shape
    if len(shape) <= 2 or any(size != 1 for size in shape[2:]):
        return distribution, samples
    rows = tuple(shape[:2])
    if isinstance(distribution, dist.Categorical):
        squeezed = dist.Categorical(logits=distribution.logits.reshape(*rows, distribution.logits.shape[-1]))
    else:
        squeezed = dist.Bernoulli(logits=distribution.logits.reshape(rows))
    return squeezed, samples.reshape(*rows, *samples.shape[len(shape):])

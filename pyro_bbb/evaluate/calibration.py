"""Post-hoc temperature scaling: calibrated *after* training, to compare with calibrated *by the posterior*.

One number ``T`` rescales a classifier's log predictive probabilities, ``p_T(c) ∝ p(c)^(1/T)`` (for a deterministic
net's softmax, dividing the logits by ``T``; Guo et al. 2017), chosen to minimise the negative log-likelihood of a
held-out validation split. ``T > 1`` softens an overconfident predictive, ``T < 1`` sharpens an underconfident one;
the predicted class never changes. Fitted on the training data it learns nothing about calibration (the training
labels are what the net fits best), so :func:`fit_temperature` refuses inputs the guide was trained on.

Examples
--------
>>> probs = torch.tensor([[0.99, 0.01], [0.99, 0.01], [0.99, 0.01], [0.01, 0.99]])
>>> scaling = TemperatureScaling().fit(probs, torch.tensor([0, 0, 1, 1]))   # 99% sure, 75% right
>>> scaling.temperature > 1.0
True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._inputs import class_labels, num_rows
from .._warnings import warn_at_caller
from ..data.provenance import fraction_seen_in_training
from ..prediction.predictive import predict_with_draws
from ..prediction.results import ClassificationPrediction
from .metrics import class_probabilities

__all__ = ["TemperatureScaling", "fit_temperature"]


def _log_probs(prediction: ClassificationPrediction | torch.Tensor) -> torch.Tensor:
    """Log class probabilities ``(batch, C)`` in float64 of a prediction or a probability tensor (binary
    ``(batch,)`` becomes two columns)."""
    probs = class_probabilities(prediction, "TemperatureScaling").detach().to(torch.float64)
    return probs.clamp_min(torch.finfo(torch.float64).tiny).log()


class TemperatureScaling:
    """One temperature for a classifier's predictive, fitted by the NLL of held-out data.

    Parameters
    ----------
    temperature : float
        The starting (or a fixed) temperature.

    Examples
    --------
    >>> scaling = TemperatureScaling(2.0)
    >>> scaling(torch.tensor([[0.8, 0.2]]))   # 0.8^(1/2) : 0.2^(1/2)
    tensor([[0.6667, 0.3333]], dtype=torch.float64)
    """

    def __init__(self, temperature: float = 1.0):
        if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"`temperature` must be a finite number > 0, got {temperature!r}.")
        self.temperature = float(temperature)

    def fit(self, prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor,
            max_iter: int = 100) -> TemperatureScaling:
        """Choose the temperature minimising the validation NLL of ``prediction`` (L-BFGS over ``log T``); returns
        ``self``. Warns when there is no such temperature (the NLL falls as ``T`` goes to 0 or grows: validation rows
        all classified correctly, or nearly all wrong).

        Examples
        --------
        >>> TemperatureScaling().fit(torch.tensor([[0.7, 0.3], [0.3, 0.7]]), torch.tensor([0, 1])).temperature < 1
        True
        """
        log_probs = _log_probs(prediction)
        y = class_labels(y, log_probs.shape[0], log_probs.shape[-1]).to(log_probs.device)
        if y.numel() < 2:
            raise ValueError("temperature scaling needs a validation split of at least two labelled inputs.")
        log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(log_probs / log_t.exp(), y)
            loss.backward()
            return loss

        optimizer.step(closure)
        self.temperature = float(log_t.detach().exp().clamp(1e-3, 1e3))
        with torch.no_grad():  # an optimum inside: the NLL is no lower at half or twice the temperature
            nll = {t: float(torch.nn.functional.cross_entropy(log_probs / t, y))
                   for t in (self.temperature / 2, self.temperature, self.temperature * 2)}
        lower = min(nll, key=nll.get)
        separable = bool((log_probs.argmax(-1) == y).all())  # (its infimum at T -> 0, wherever L-BFGS stopped)
        if separable or nll[lower] < nll[self.temperature] * (1 - 1e-6):
            which = ("all classified correctly, so the NLL falls as T goes to 0" if separable or
                     lower < self.temperature else "classified so badly that the NLL falls as T grows")
            warn_at_caller(
                f"temperature scaling found no temperature that minimises the validation NLL: the {y.numel()} "
                f"validation rows are {which} (stopped at T = {self.temperature:.3g}, meaningless). Hold out more "
                "rows (e.g. 10-20% of the data) for the temperature.")
        return self

    def __call__(self, prediction: ClassificationPrediction | torch.Tensor) -> torch.Tensor:
        """The calibrated class probabilities ``(batch, C)`` (float64)."""
        return torch.softmax(_log_probs(prediction) / self.temperature, -1)

    def __repr__(self) -> str:
        return f"TemperatureScaling(temperature={self.temperature:.4g})"


def fit_temperature(model: Callable, guide: Callable, validation_data: tuple[torch.Tensor, torch.Tensor], *,
                    num_samples: int = 64, data_plate: str | None = None) -> TemperatureScaling:
    """Temperature scaling of ``predict(model, guide, x)`` fitted on ``validation_data``, a split held out of
    training: a clear error when every validation input is one the guide was trained on by :func:`pyro_bbb.fit`.
    ``data_plate`` names a hand-written model's data plate, as in :func:`pyro_bbb.predict`.

    Examples
    --------
    >>> x, y = torch.randn(80, 4), torch.randint(0, 3, (80,))
    >>> bnn = BNN(BayesianLinear(4, 3), likelihoods.Categorical())
    >>> guide = MeanFieldGuide(bnn)
    >>> _ = pyro_bbb.fit(bnn, guide, (x[:60], y[:60]), epochs=2, progress=False)
    >>> fit_temperature(bnn, guide, (x[60:], y[60:])).temperature > 0
    True
    >>> fit_temperature(bnn, guide, (x[:60], y[:60]))
    Traceback (most recent call last):
    ...
    ValueError: every validation input is one the guide was trained on: temperature scaling fitted on the training ...
    """
    if not isinstance(validation_data, tuple | list) or len(validation_data) != 2:
        raise TypeError("validation_data must be an (x, y) pair of held-out inputs and labels.")
    x, y = validation_data
    from ..likelihoods import Bernoulli, Categorical, Likelihood  # (here: likelihoods import the prediction package)

    likelihood = getattr(model, "likelihood", None)  # (known before any draw: a pyro_bbb likelihood's kind)
    if isinstance(likelihood, Likelihood) and not isinstance(likelihood, Categorical | Bernoulli):
        raise TypeError(f"temperature scaling is for a classifier (a Categorical or Bernoulli likelihood); this "
                        f"model's is {type(likelihood).__name__}.")
    if num_rows(x) != len(y):
        raise ValueError(f"validation_data's x has {num_rows(x)} rows but y has {len(y)}: one label per row.")
    if fraction_seen_in_training(guide, x) == 1.0:
        raise ValueError(
            "every validation input is one the guide was trained on: temperature scaling fitted on the training data "
            "learns the fit, not the calibration. Hold a split out of training (e.g. 10-20% of the data, never passed "
            "to fit) and fit the temperature on it."
        )
    prediction = predict_with_draws(model, guide, x, num_samples=num_samples, data_plate=data_plate,
                                    caller="fit_temperature")[0]
    if not isinstance(prediction, ClassificationPrediction):
        raise TypeError("temperature scaling is for a classifier (a Categorical or Bernoulli likelihood).")
    return TemperatureScaling().fit(prediction, y)

"""Validation-based early stopping for :func:`pyro_bbb.fit`: stop when a monitored metric stops improving, and
hand back the parameters of its best epoch.

Early stopping is a choice of recipe, not a converged posterior: an early-stopped mean-field posterior is usually
narrower than the ELBO's optimum. Say so when you report its numbers (the UCI benchmark labels such rows).

Examples
--------
>>> x, y = torch.randn(200, 3), torch.randn(200)
>>> bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> stop = EarlyStopping(patience=3)
>>> history = pyro_bbb.fit(bnn, guide, (x[:160], y[:160]), epochs=50, batch_size=32, lr=1e-2, progress=False,
...                        seed=0, validation_data=(x[160:], y[160:]), early_stopping=stop)
>>> history.best_epoch == stop.best_epoch and stop.best_epoch <= len(history)
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from .._checks import check_count, is_number

__all__ = ["EarlyStopping"]

#: The History keys that can be monitored; of these, larger is better for the ``MAXIMISED`` ones.
MONITORABLE = ("val_log_likelihood", "val_rmse", "val_accuracy", "val_ece", "loss", "loss_per_datum", "nll", "kl")
MAXIMISED = ("val_log_likelihood", "val_accuracy")


class EarlyStopping:
    """Stop :func:`~pyro_bbb.fit` once ``monitor`` has not improved for ``patience`` epochs, and restore the
    parameters of the best epoch when training ends (early or not).

    The monitored value is read from each epoch's :class:`~pyro_bbb.train.History` record: a validation metric
    (``"val_log_likelihood"``, the default, ``"val_rmse"``, ``"val_accuracy"``, ``"val_ece"`` -- these need
    ``fit(validation_data=...)``) or a training one (``"loss"``, ``"nll"``). An epoch improves on the best when it is
    better by more than ``min_delta``. Restoring copies the values of every parameter ``fit`` trained back in place
    (the optimizer's state and module buffers are not rewound). One instance serves one ``fit`` call at a time; a
    new call starts it afresh.

    Parameters
    ----------
    patience : int
        Epochs without improvement before stopping.
    monitor : str
        The History key to watch.
    mode : {"max", "min"}, optional
        Whether larger is better; by default ``"max"`` for ``val_log_likelihood`` and ``val_accuracy``, else
        ``"min"``.
    min_delta : float
        The least change that counts as an improvement.
    restore_best : bool
        Put the best epoch's parameters back when training ends.

    Attributes
    ----------
    best_epoch : int or None
        The epoch with the best monitored value so far.
    best_value : float
        Its value.
    stopped_epoch : int or None
        The epoch after which training was stopped for want of improvement (``None``: it was not).

    Examples
    --------
    >>> stop = EarlyStopping(patience=2)
    >>> [stop.improved(epoch, {"val_log_likelihood": v}) for epoch, v in enumerate([-1.0, -0.5, -0.6], 1)]
    [True, True, False]
    >>> stop.best_epoch, stop.should_stop(3)
    (2, False)
    >>> stop.improved(4, {"val_log_likelihood": -0.7}), stop.should_stop(4)
    (False, True)
    """

    def __init__(self, patience: int, monitor: str = "val_log_likelihood", mode: str | None = None,
                 min_delta: float = 0.0, restore_best: bool = True):
        check_count("patience", patience)
        if monitor not in MONITORABLE:
            raise ValueError(f"monitor must be one of {MONITORABLE} (History keys), got {monitor!r}.")
        if mode is None:
            mode = "max" if monitor in MAXIMISED else "min"
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
        if not (is_number(min_delta) and math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}.")
        self.patience, self.monitor, self.mode = patience, monitor, mode
        self.min_delta, self.restore_best = float(min_delta), restore_best
        self.reset()

    def reset(self) -> None:
        """Forget the best epoch and its parameters (``fit`` calls this when it starts)."""
        self.best_epoch: int | None = None
        self.best_value = -math.inf if self.mode == "max" else math.inf
        self.stopped_epoch: int | None = None
        self._best: dict[torch.Tensor, torch.Tensor] = {}

    def check_monitor(self, has_validation_data: bool, classifier: bool | None = None) -> None:
        """Raise ``ValueError`` when ``monitor`` names a validation metric and there is no validation data, or a
        metric the model's kind does not have (``classifier``: ``None`` when unknown).

        Examples
        --------
        >>> EarlyStopping(patience=5, monitor="val_rmse").check_monitor(True, classifier=True)
        Traceback (most recent call last):
        ...
        ValueError: EarlyStopping(monitor='val_rmse') watches a regression's metric, but the model is a classifier: ...
        """
        if self.monitor.startswith("val_") and not has_validation_data:
            raise ValueError(
                f"EarlyStopping(monitor={self.monitor!r}) watches a validation metric, but fit got no "
                "validation_data: pass fit(..., validation_data=(x_val, y_val)), or monitor a training key such as "
                "'loss'."
            )
        wrong = {True: ("val_rmse",), False: ("val_accuracy", "val_ece")}.get(classifier, ())
        if self.monitor in wrong:
            kind, other = ("a regression's", "a classifier") if classifier else ("a classifier's", "a regression")
            mine = "val_accuracy or val_ece" if classifier else "val_rmse"
            raise ValueError(
                f"EarlyStopping(monitor={self.monitor!r}) watches {kind} metric, but the model is {other}: monitor "
                f"{mine} or val_log_likelihood."
            )

    def improved(self, epoch: int, record: dict[str, Any], params: Iterable[torch.Tensor] = ()) -> bool:
        """Take an epoch's record; when it is the best so far, remember ``epoch`` and copy ``params``."""
        if self.monitor not in record:
            raise ValueError(
                f"EarlyStopping monitors {self.monitor!r}, which this model's History does not record (its keys: "
                f"{sorted(record)}); e.g. val_rmse is for regression, val_accuracy and val_ece for classification."
            )
        value = float(record[self.monitor])
        sign = 1.0 if self.mode == "max" else -1.0
        if not (math.isfinite(value) and sign * (value - self.best_value) > self.min_delta):
            return False
        self.best_epoch, self.best_value = epoch, value
        if self.restore_best:
            self._remember(list(params))
        return True

    def should_stop(self, epoch: int) -> bool:
        """Whether ``patience`` epochs have passed since the best one (records the stop)."""
        best = self.best_epoch if self.best_epoch is not None else 0
        if epoch - best >= self.patience:
            self.stopped_epoch = epoch
            return True
        return False

    @torch.no_grad()
    def restore(self) -> None:
        """Copy the best epoch's parameter values back in place (nothing when there is no best epoch)."""
        if not self.restore_best:
            return
        for param, value in self._best.items():
            param.copy_(value)

    @torch.no_grad()
    def _remember(self, params: list[torch.Tensor]) -> None:
        for param in params:
            kept = self._best.get(param)  # tensors hash by identity
            if kept is None or kept.shape != param.shape:
                self._best[param] = param.detach().clone()
            else:
                kept.copy_(param)

    def __repr__(self) -> str:
        return (f"EarlyStopping(patience={self.patience}, monitor={self.monitor!r}, mode={self.mode!r}, "
                f"min_delta={self.min_delta}, restore_best={self.restore_best})")

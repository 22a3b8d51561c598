"""The plots people look at: training traces, posterior width per layer, calibration, predictive bands.

Every function returns its matplotlib figure and, given ``path``, saves it (PNG by extension). Needs matplotlib
(``pip install matplotlib``). ArviZ's own plots (``plot_posterior``, ``plot_forest``, ``plot_ppc``,
``plot_loo_pit``) work on :func:`pyro_bbb.evaluate.to_inference_data`'s export.

Examples
--------
>>> import matplotlib
>>> matplotlib.use("Agg")
>>> from pyro_bbb.prediction import ClassificationPrediction
>>> pred = ClassificationPrediction(dist.Categorical(logits=torch.randn(20, 50, 3)), torch.zeros(20, 50))
>>> fig = plot_reliability(pred, torch.randint(0, 3, (50,)))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from ..infer.guide import require_fitted_posteriors, site_loc_scale
from ..infer.tempering import kl_weight_of
from ..nn.module import site_owners
from ..prediction.results import ClassificationPrediction, Prediction, RegressionPrediction
from ..priors import is_real_support
from . import metrics
from .diagnostics import layer_summary, normal_sites

__all__ = ["plot_history", "plot_std_ratio", "plot_reliability", "plot_predictive_band", "plot_risk_coverage",
           "plot_ood_scores", "save_figure", "symlog_yaxis"]

#: Legend and annotation size: readable when a 12-inch-wide figure is shown at a page's text width.
SMALL_FONT = 9


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("pyro_bbb.evaluate.plots needs matplotlib: pip install matplotlib") from error
    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Lay ``fig`` out, write it to ``path`` as PNG (creating the folder) and close it; returns the path.

    Examples
    --------
    >>> import tempfile, matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> save_figure(fig, Path(tempfile.mkdtemp()) / "figures" / "empty.png").name
    'empty.png'
    """
    plt = _pyplot()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def symlog_yaxis(ax, linthresh: float = 1.0) -> None:
    """Give ``ax`` a symmetric-log y axis (linear within ``linthresh`` of zero, logarithmic beyond) whose ticks can be
    read: 1, 2 and 5 in every decade beyond ``linthresh`` and evenly spaced ones inside it, written as plain numbers,
    so a loss between 2 and 8, or between -0.7 and 0, gets ticks rather than one "10^0".

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> _ = ax.plot([1, 2, 3], [2.5, 4.0, 7.5])
    >>> symlog_yaxis(ax)
    >>> fig.canvas.draw()
    >>> [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    ['3', '4', '5', '6', '7']
    """
    from matplotlib import ticker

    class SymlogTicks(ticker.Locator):
        def __call__(self):
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, low, high):
            choices = {}  # 1-2-5 in every decade; powers of 10 alone over many decades; every integer over few
            for subs in ((1.0, 2.0, 5.0), (1.0,), tuple(float(k) for k in range(1, 10))):
                decades = ticker.SymmetricalLogLocator(base=10, linthresh=linthresh, subs=subs)
                choices[subs] = [t for t in decades.tick_values(low, high) if abs(t) >= linthresh and low <= t <= high]
            ticks = next((t for t in choices.values() if 2 <= len(t) <= 8), max(choices.values(), key=len))
            inner_low, inner_high = max(low, -linthresh), min(high, linthresh)
            if inner_low < inner_high:  # the linear part: evenly spaced, clear of the decades' first ticks
                ticks += [t for t in ticker.MaxNLocator(4).tick_values(inner_low, inner_high)
                          if inner_low <= t <= inner_high and (abs(t) < 0.75 * linthresh or not ticks)]
            return sorted(set(ticks))

    ax.set_yscale("symlog", linthresh=linthresh)
    ax.yaxis.set_major_locator(SymlogTicks())
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_locator(ticker.NullLocator())


def _finish(fig, path: str | Path | None):
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


def plot_history(history, path: str | Path | None = None):
    """Training traces from :class:`pyro_bbb.train.History` against the epoch: the loss and NLL per datum (and the
    validation NLL), the KL per layer, the posterior std / prior std per layer, and the KL weight when a schedule
    changed it (a constant weight is named in the KL panel's title instead). With early stopping, a dotted line
    marks the best epoch (whose parameters fit returned).

    Examples
    --------
    >>> from pyro_bbb.train.history import History
    >>> h = History()
    >>> for e in (1, 2):
    ...     h.append({"epoch": e, "loss": 10.0 / e, "loss_per_datum": 1.0 / e, "nll": 5.0, "num_data": 10,
    ...               "kl": 5.0, "kl_weight": 1.0, "kl_by_layer": {"fc": 5.0}, "std_ratio": {"fc": 0.5}})
    >>> [ax.get_title() for ax in plot_history(h).axes]
    ['loss', 'KL(q || p) per layer (KL weight 1)', 'posterior std / prior std']
    """
    if not history.records:
        cause = " (fit was interrupted before its first epoch ended)" if history.interrupted else ""
        raise ValueError(f"this History has no epoch to plot{cause}: train at least one epoch first.")
    plt = _pyplot()
    epochs = history["epoch"]
    weights = history["kl_weight"]
    scheduled = len(set(weights)) > 1
    fig, axes = plt.subplots(1, 4 if scheduled else 3, figsize=(16 if scheduled else 12.5, 3.6))
    loss, kl, ratio = axes[0], axes[1], axes[2]
    loss.plot(epochs, [r["loss"] / r["num_data"] for r in history.records], label="loss per datum")
    loss.plot(epochs, [r["nll"] / r["num_data"] for r in history.records], label="NLL per datum")
    validated = [(r["epoch"], -r["val_log_likelihood"]) for r in history.records
                 if r.get("val_log_likelihood") is not None]  # (a History assembled by hand may have it in some)
    if validated:
        loss.plot(*zip(*validated), label="validation NLL per datum")
    # symlog: linear within +-1 nat, logarithmic beyond, so a loss that starts in the hundreds and ends near zero
    # (or below: a density's NLL may be negative) shows both ends
    loss.set(xlabel="epoch", ylabel="nats per datum (symlog)", title="loss")
    symlog_yaxis(loss)
    per_layer = "kl_by_layer" in history.keys()  # absent for guides without a Normal posterior per weight
    for layer, values in (history["kl_by_layer"] if per_layer else {"total": history["kl"]}).items():
        kl.plot(epochs, values, label=layer)
    kl.set(xlabel="epoch", ylabel="nats", yscale="log",
           title="KL(q || p) per layer" + ("" if scheduled else f" (KL weight {weights[0]:g})"))
    # the geometric mean per layer, as check_posterior judges collapse (a History from before it was recorded: the mean)
    widths = "std_ratio_geomean" if "std_ratio_geomean" in history.keys() else "std_ratio"
    for layer, values in (history[widths] if per_layer else {}).items():
        ratio.plot(epochs, values, label=layer)
    ratio.axhline(1.0, color="k", lw=0.8, ls="--")
    average = "geometric mean" if widths == "std_ratio_geomean" else "mean"
    ratio.set(xlabel="epoch", ylabel=f"ratio, {average} per layer (1: the prior)", yscale="log",
              title="posterior std / prior std" if per_layer else "posterior std (not available)")
    if scheduled:
        axes[3].plot(epochs, weights, color="k")
        axes[3].set(xlabel="epoch", title="KL weight (schedule)")
    best = getattr(history, "best_epoch", None)
    if best is not None:
        for ax in axes:
            ax.axvline(best, color="0.4", lw=0.8, ls=":", label="best epoch" if ax is loss else None)
    for ax in (loss, kl, ratio):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=SMALL_FONT)
    return _finish(fig, path)


@torch.no_grad()
def plot_std_ratio(model: Callable, guide, path: str | Path | None = None, bins: int = 40):
    """Histogram, per Bayesian layer, of every weight's posterior std, with the prior std marked.

    Mass at the prior line: weights the data does not inform (prunable). Mass far below it: weights the data pins
    down. All of it near zero: a collapsed posterior; all of it at the line: one that ignores the data. A guide
    trained at a KL weight other than 1 says so in the figure's title (a tempered posterior is narrower by design).

    Examples
    --------
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=0.1)
    >>> _ = guide(torch.randn(4, 3))
    >>> len(plot_std_ratio(layer, guide).axes)
    1
    """
    require_fitted_posteriors(guide, "plot_std_ratio", some=True)
    plt = _pyplot()
    owners = site_owners(model)
    scales: dict[str, list[torch.Tensor]] = {}
    for name, site in normal_sites(guide):  # (an AutoGuideList's point-estimate sites have no width)
        if name in owners and is_real_support(site["fn"].support):
            scales.setdefault(owners[name], []).append(site_loc_scale(guide, name)[1].reshape(-1).cpu())
    if not scales:
        raise ValueError("the model has no Bayesian layers to plot." if not owners else
                         "the guide gives none of the model's Bayesian layers' weights a Normal posterior per site "
                         "(an AutoGuideList's AutoNormal or MeanFieldGuide parts cover other sites): nothing to plot.")
    kl = layer_summary(model, guide)
    fig, axes = plt.subplots(1, len(scales), figsize=(4 * len(scales), 3.2), squeeze=False)
    for ax, (layer, values) in zip(axes[0], scales.items()):
        std = torch.cat(values).double().clamp_min(1e-12).log10()
        low, high = float(std.min()), float(std.max())
        span = max(high - low, 0.1)  # all widths (nearly) equal, e.g. at initialisation: one visible bar
        ax.hist(std.numpy(), bins=bins, range=(low - 0.05 * span, low + 1.05 * span), color="C0", alpha=0.8)
        # the layer's mean prior std over its weights and biases (an empirical-Bayes prior at its scale given q)
        ax.axvline(math.log10(kl[layer]["prior_std"]), color="k", ls="--", label="prior std")
        ax.set(xlabel="log10 posterior std", ylabel="weights",
               title=f"{layer}: KL {kl[layer]['kl']:.0f} nats, {kl[layer]['num_weights']} weights")
        ax.legend(fontsize=SMALL_FONT)
    choice = kl_weight_of(guide)
    if choice is not None and choice.tempered:
        fig.suptitle(f"trained at KL weight {choice.kl_weight:g}: a tempered posterior, narrower than the Bayes one",
                     fontsize=SMALL_FONT)
    return _finish(fig, path)


def plot_reliability(prediction: ClassificationPrediction | torch.Tensor, y: torch.Tensor, num_bins: int = 10,
                     path: str | Path | None = None, *, ax=None, title: str = "reliability", equal_mass: bool = False):
    """Reliability diagram: accuracy against confidence in equal-width bins, with counts and the ECE; with
    ``equal_mass=True``, in bins of equal counts (each bar spans its inputs' confidences) with the adaptive ECE of
    :func:`~pyro_bbb.evaluate.metrics.adaptive_calibration_error`, which a confident net's crowded top bin hides less.

    ``prediction`` may also be a tensor of class probabilities (a deterministic model's, to compare); ``ax`` draws
    into an existing matplotlib axes (side-by-side comparisons) and ``title`` heads it (the ECE is appended).

    Examples
    --------
    See the module example.
    """
    plt = _pyplot()
    probs, y = metrics.labelled_probabilities(prediction, y, "plot_reliability")  # (any form of labels)
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).float()
    if equal_mass:
        order = torch.argsort(confidence, stable=True)
        groups = [order[part] for part in torch.tensor_split(torch.arange(len(order)), num_bins) if part.numel()]
        spans = [(float(confidence[g].min()), float(confidence[g].max())) for g in groups]
    else:
        bins = (confidence * num_bins).long().clamp(max=num_bins - 1)
        groups = [torch.nonzero(bins == b).squeeze(-1) for b in range(num_bins)]
        spans = [(b / num_bins, (b + 1) / num_bins) for b in range(num_bins)]
    fig, ax = plt.subplots(figsize=(4.5, 4)) if ax is None else (ax.figure, ax)
    for group, (low, high) in zip(groups, spans):
        if group.numel():
            accuracy, mean_confidence = float(correct[group].mean()), float(confidence[group].mean())
            width = max(high - low, 0.005)
            ax.bar(low, accuracy, width=width, align="edge", edgecolor="k", color="C0", alpha=0.6)
            ax.plot(mean_confidence, accuracy, "o", color="C3", ms=4)
            ax.text(low + width / 2, accuracy + 0.02, str(int(group.numel())), ha="center", fontsize=SMALL_FONT)
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.plot([], [], "o", color="C3", ms=4, label="(mean confidence, accuracy)")
    if equal_mass:
        label = f"adaptive ECE {metrics.adaptive_calibration_error(probs, y, num_bins):.3f}"
    else:
        label = f"ECE {metrics.expected_calibration_error(probs, y, num_bins):.3f}"
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.1), title=f"{title} ({label})")
    ax.legend(fontsize=SMALL_FONT, loc="upper left")
    return _finish(fig, path)


def plot_risk_coverage(predictions: dict[str, Prediction], y: torch.Tensor, score: str | None = None,
                       path: str | Path | None = None, *, ax=None):
    """Selective prediction: the risk (error rate, or MSE for a regression) of the surest fraction of the inputs
    against that fraction, one curve per named prediction, each labelled with its AURC. The score defaults to each
    prediction's own (:func:`pyro_bbb.evaluate.metrics.default_score`: max probability for a classifier, std for a
    regression).

    Examples
    --------
    ::

        plot_risk_coverage({"BNN": pred, "ensemble": ens_pred}, y_test, path="risk_coverage.png")
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4)) if ax is None else (ax.figure, ax)
    shown = sorted({score or metrics.default_score(prediction, selective=True) for prediction in predictions.values()})
    for name, prediction in predictions.items():
        coverage, risk = metrics.risk_coverage(prediction, y, score)
        ax.plot(coverage.cpu(), risk.cpu(), label=f"{name} (AURC {float(risk.mean()):.4f})")
    ax.set(xlabel="coverage (fraction predicted, surest first)", ylabel="risk of the predicted", xlim=(0, 1),
           title=f"risk against coverage ({', '.join(shown).replace('_', ' ')})")
    ax.legend(fontsize=SMALL_FONT)
    return _finish(fig, path)


def plot_ood_scores(inside: Prediction | torch.Tensor, outside: Prediction | torch.Tensor, score: str | None = None,
                    path: str | Path | None = None, *, ax=None, title: str = "", bins: int = 40):
    """Histograms of the uncertainty score on in- and out-of-distribution inputs, titled with the detection AUROC and
    the FPR at 95% TPR: how far apart the two sets lie. The score defaults to the prediction's own
    (:func:`pyro_bbb.evaluate.metrics.default_score`: predictive entropy for a classifier, std for a regression).

    Examples
    --------
    ::

        plot_ood_scores(predict(bnn, guide, x_test), predict(bnn, guide, x_shifted), path="ood.png")
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5)) if ax is None else (ax.figure, ax)
    score = score or metrics.default_score(outside if isinstance(inside, torch.Tensor) else inside)
    scores_in = metrics.uncertainty_score(inside, score).cpu()
    scores_out = metrics.uncertainty_score(outside, score).cpu()
    both = torch.cat([scores_in, scores_out]).double()
    low, high = float(both.min()), float(both.max()) + 1e-12
    if high - low <= 1e-12:  # every score equal: a narrow span around it, not bins of no width
        half = 5e-7 * max(1.0, abs(low))
        low, high = low - half, high + half
    edges = torch.linspace(low, high, bins + 1, dtype=torch.float64)
    ax.hist(scores_in, bins=edges, alpha=0.6, density=True, label="in distribution")
    ax.hist(scores_out, bins=edges, alpha=0.6, density=True, label="out of distribution")
    auroc, fpr = metrics.ood_auroc(scores_in, scores_out), metrics.fpr_at_tpr(scores_in, scores_out)
    ax.set(xlabel=score.replace("_", " "), ylabel="density",
           title=f"{title + ': ' if title else ''}AUROC {auroc:.3f}, FPR@95 {fpr:.3f}")
    ax.legend(fontsize=SMALL_FONT)
    return _finish(fig, path)


def plot_predictive_band(
    prediction: RegressionPrediction,
    x: torch.Tensor,
    *,
    x_train: torch.Tensor | None = None,
    y_train: torch.Tensor | None = None,
    truth: Callable[[torch.Tensor], torch.Tensor] | None = None,
    level: float = 0.9,
    path: str | Path | None = None,
    output: int | None = None,
):
    """1-D regression: predictive mean, the ``level`` predictive interval and the ±2 sd epistemic band.

    A net with several outputs per row draws one of them: ``output=j`` (and ``y_train``'s column ``j``).

    Examples
    --------
    >>> from pyro_bbb.prediction import RegressionPrediction
    >>> grid = torch.linspace(-1, 1, 20).unsqueeze(-1)
    >>> pred = RegressionPrediction(dist.Normal(torch.randn(30, 20), 0.1), torch.zeros(30, 20))
    >>> fig = plot_predictive_band(pred, grid, truth=torch.sin)
    >>> two = RegressionPrediction(dist.Normal(torch.randn(30, 20, 2), 0.1).to_event(1), torch.zeros(30, 20, 2))
    >>> fig = plot_predictive_band(two, grid, output=1)   # the second output
    """
    plt = _pyplot()
    if x.dim() > 2 or (x.dim() == 2 and x.shape[-1] != 1):
        raise ValueError(f"plot_predictive_band draws 1-D inputs, got x of shape {tuple(x.shape)}.")
    if len(x.reshape(-1)) != len(prediction):
        raise ValueError(f"x has {len(x.reshape(-1))} rows but the prediction has {len(prediction)}: pass the "
                         "inputs the prediction was made for.")
    columns = _one_output(prediction, output)
    g = x.reshape(-1).cpu()
    order = g.argsort()
    g = g[order]
    mean, epistemic = columns(prediction.mean).cpu()[order], columns(prediction.epistemic_std).cpu()[order]
    lower, upper = (columns(t).cpu()[order] for t in prediction.interval(level))
    if y_train is not None and output is not None and y_train.dim() > 1:
        y_train = y_train[:, output]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(g, lower, upper, alpha=0.2, color="C0", label=f"{level:.0%} predictive interval")
    ax.fill_between(g, mean - 2 * epistemic, mean + 2 * epistemic, alpha=0.4, color="C0", label="±2 sd epistemic")
    ax.plot(g, mean, color="C0", label="predictive mean")
    if truth is not None:
        ax.plot(g, truth(g), "k--", lw=1, label="truth")
    if x_train is not None and y_train is not None:
        ax.scatter(x_train.reshape(-1).cpu(), y_train.cpu(), s=5, color="k", alpha=0.5, label="training data")
    ax.set(xlabel="x", ylabel="y")
    ax.legend(fontsize=SMALL_FONT, loc="lower left")
    return _finish(fig, path)


def _one_output(prediction: RegressionPrediction, output: int | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """What takes a per-row summary of ``prediction`` (shape ``(rows, *outputs)``) to the one output drawn."""
    outputs = tuple(prediction.mean.shape[1:])
    if output is None:
        if outputs not in {(), (1,)}:
            raise ValueError(f"the prediction has outputs of shape {outputs} per row; plot_predictive_band draws one: "
                             f"pass output=j for column j (0 to {outputs[0] - 1}).")
        return lambda t: t.reshape(len(t))
    if len(outputs) != 1 or not -outputs[0] <= output < outputs[0]:
        raise ValueError(f"output={output} names no column of a prediction with outputs of shape {outputs} per row.")
    return lambda t: t[:, output]

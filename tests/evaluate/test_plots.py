import math

import matplotlib

matplotlib.use("Agg")

import pyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.evaluate import metrics, plots  # noqa: E402
from pyro_bbb.nn import BayesianLinear  # noqa: E402
from pyro_bbb.prediction.results import ClassificationPrediction, RegressionPrediction  # noqa: E402


def test_history_and_std_ratio_plots(tmp_path):
    net = torch.nn.Sequential(BayesianLinear(1, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(40, 1), torch.randn(40)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=3, progress=False, validation_data=(x, y),
                           early_stopping=pyro_bbb.EarlyStopping(patience=5))
    fig = plots.plot_history(history, tmp_path / "history.png")
    assert "best epoch" in fig.axes[0].get_legend_handles_labels()[1]
    fig = plots.plot_std_ratio(bnn, guide, tmp_path / "std.png")
    assert len(fig.axes) == 2  # one panel per Bayesian layer
    for name in ("history.png", "std.png"):
        assert (tmp_path / name).stat().st_size > 5000


def test_reliability_and_band(tmp_path):
    pred = ClassificationPrediction(dist.Categorical(logits=torch.randn(10, 40, 4)), torch.zeros(10, 40))
    plots.plot_reliability(pred, torch.randint(0, 4, (40,)), path=tmp_path / "reliability.png")
    binary = ClassificationPrediction(dist.Bernoulli(logits=torch.randn(10, 40)), torch.zeros(10, 40))
    plots.plot_reliability(binary, torch.randint(0, 2, (40,)))
    grid = torch.linspace(-2, 2, 30).unsqueeze(-1)
    band = RegressionPrediction(dist.Normal(torch.randn(10, 30), 0.2), torch.zeros(10, 30))
    plots.plot_predictive_band(band, grid, x_train=grid, y_train=torch.zeros(30), truth=torch.sin,
                               path=tmp_path / "band.png")
    assert (tmp_path / "reliability.png").exists() and (tmp_path / "band.png").exists()
    with pytest.raises(ValueError, match="1-D inputs"):
        plots.plot_predictive_band(band, torch.randn(30, 2))


def test_the_band_of_a_net_with_two_outputs_draws_the_one_named_and_refuses_to_guess():
    """A multi-output prediction raised "'y1' is not 1-dimensional" from matplotlib; an x of the wrong length too."""
    grid = torch.linspace(-2, 2, 30).unsqueeze(-1)
    loc = torch.stack([torch.zeros(10, 30), torch.sin(grid.reshape(-1)).expand(10, 30)], -1)
    two = RegressionPrediction(dist.Normal(loc, 0.2).to_event(1), torch.zeros(10, 30, 2))
    with pytest.raises(ValueError, match=r"outputs of shape \(2,\) per row.*pass output=j"):
        plots.plot_predictive_band(two, grid)
    with pytest.raises(ValueError, match="x has 5 rows but the prediction has 30"):
        plots.plot_predictive_band(two, grid[:5], output=0)
    with pytest.raises(ValueError, match="output=2 names no column"):
        plots.plot_predictive_band(two, grid, output=2)
    fig = plots.plot_predictive_band(two, grid, output=1, x_train=grid, y_train=torch.zeros(30, 2))
    drawn = fig.axes[0].lines[0].get_ydata()  # the predictive mean: the second output's sine
    assert torch.allclose(torch.as_tensor(drawn, dtype=torch.float32), torch.sin(grid.reshape(-1)), atol=1e-6)


def test_risk_coverage_and_ood_score_plots(tmp_path):
    g = torch.Generator().manual_seed(0)
    sure = torch.softmax(torch.randn(4, 50, 3, generator=g) * 3, -1)
    unsure = torch.softmax(torch.randn(4, 30, 3, generator=g) * 0.3, -1)
    inside = ClassificationPrediction(dist.Categorical(probs=sure), torch.zeros(4, 50))
    outside = ClassificationPrediction(dist.Categorical(probs=unsure), torch.zeros(4, 30))
    y = torch.randint(0, 3, (50,), generator=g)
    fig = plots.plot_risk_coverage({"a": inside, "b": inside}, y, path=tmp_path / "rc.png")
    assert (tmp_path / "rc.png").stat().st_size > 1000 and len(fig.axes[0].lines) == 2
    plots.plot_ood_scores(inside, outside, path=tmp_path / "ood.png", title="shifted")
    assert (tmp_path / "ood.png").stat().st_size > 1000
    fig = plots.plot_ood_scores(inside, outside, score="mutual_information")
    assert "AUROC" in fig.axes[0].get_title()


def test_ood_scores_that_are_all_equal_still_draw_their_bars():
    """Every score equal (a fixed noise's std): the bins had zero width, an empty plot saved with numpy's warnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.plot_ood_scores(torch.full((10,), 0.7), torch.full((5,), 0.7), score="score")
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert sum(h > 0 for h in heights) == 2 and all(math.isfinite(h) for h in heights)


def test_risk_coverage_and_ood_score_plots_of_a_regression_read_its_std_unasked():
    std_in, std_out = torch.linspace(0.5, 1.0, 40), torch.linspace(0.8, 2.0, 25)
    inside = RegressionPrediction(dist.Normal(torch.zeros(3, 40), std_in), torch.zeros(3, 40))
    outside = RegressionPrediction(dist.Normal(torch.zeros(3, 25), std_out), torch.zeros(3, 25))
    fig = plots.plot_ood_scores(inside, outside)
    assert fig.axes[0].get_xlabel() == "std"
    assert f"AUROC {metrics.ood_auroc(std_in, std_out):.3f}" in fig.axes[0].get_title()
    fig = plots.plot_risk_coverage({"a": inside}, torch.randn(40))
    assert fig.axes[0].get_title() == "risk against coverage (std)"


def test_reliability_in_equal_mass_bins_shows_the_adaptive_ece():
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(200, 4, generator=g) * 3, -1)
    y = torch.randint(0, 4, (200,), generator=g)
    fig = plots.plot_reliability(probs, y, num_bins=5, equal_mass=True)
    ax = fig.axes[0]
    assert f"adaptive ECE {metrics.adaptive_calibration_error(probs, y, 5):.3f}" in ax.get_title()
    assert sorted(int(t.get_text()) for t in ax.texts) == [40] * 5  # five bins of 40 inputs each


def test_the_history_plots_the_geometric_mean_width_check_posterior_judges_by():
    """One very wide weight lifts a layer's mean ratio but not its geometric mean: the panel must not hide a
    collapse (and a History recorded before the geometric mean was kept still plots, with its mean)."""
    history = pyro_bbb.train.History()
    for epoch in (1, 2):
        history.append({"epoch": epoch, "loss": 1.0, "nll": 1.0, "kl": 1.0, "kl_weight": 1.0, "num_data": 10,
                        "kl_by_layer": {"fc": 1.0}, "std_ratio": {"fc": 0.25}, "std_ratio_geomean": {"fc": 0.007}})
    ratio = plots.plot_history(history).axes[2]
    assert ratio.lines[0].get_ydata().tolist() == [0.007, 0.007] and "geometric mean" in ratio.get_ylabel()
    for record in history.records:
        del record["std_ratio_geomean"]
    ratio = plots.plot_history(history).axes[2]
    assert ratio.lines[0].get_ydata().tolist() == [0.25, 0.25] and "geometric" not in ratio.get_ylabel()


def test_the_history_plots_a_validation_score_some_epochs_have():
    """A History assembled by hand (or joined from runs with and without validation data): -None failed."""
    history = pyro_bbb.train.History()
    for epoch in (1, 2, 3):
        history.append({"epoch": epoch, "loss": 1.0, "nll": 1.0, "kl": 1.0, "kl_weight": 1.0, "num_data": 10,
                        **({"val_log_likelihood": -0.5 * epoch} if epoch != 2 else {})})
    validation = plots.plot_history(history).axes[0].lines[2]
    assert validation.get_xdata().tolist() == [1, 3] and validation.get_ydata().tolist() == [0.5, 1.5]


@pytest.mark.parametrize("labels", ["column", "one-hot"])
def test_reliability_takes_labels_in_every_form_the_metrics_take(labels):
    """(N, 1) labels broadcast against (N,) predictions: an (N, N) comparison drew bars near 1 / C everywhere."""
    g = torch.Generator().manual_seed(0)
    probs = torch.randn(200, 3, generator=g).mul(2).softmax(-1)
    y = torch.distributions.Categorical(probs=probs).sample()
    other = y[:, None] if labels == "column" else torch.nn.functional.one_hot(y, 3)
    heights = [[bar.get_height() for bar in plots.plot_reliability(probs, target).axes[0].patches]
               for target in (y, other)]
    assert heights[0] == heights[1]


def test_the_std_ratio_plot_of_a_guide_list_shows_its_normal_part_only():
    """An AutoGuideList of a point-estimate body and a Normal head: one panel, the head's (the body has no width);
    a guide with no Normal posterior anywhere is refused by name, not as a model 'without Bayesian layers'."""
    import pyro
    import pyro.poutine as poutine
    from pyro.infer.autoguide import AutoDelta, AutoGuideList, AutoNormal

    pyro.clear_param_store()
    net = torch.nn.Sequential(BayesianLinear(1, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    guide = AutoGuideList(bnn)
    guide.append(AutoDelta(poutine.block(bnn, hide=["net.2.weight", "net.2.bias"])))
    guide.append(AutoNormal(poutine.block(bnn, expose=["net.2.weight", "net.2.bias"])))
    x, y = torch.randn(40, 1), torch.randn(40)
    guide(x, y)
    fig = plots.plot_std_ratio(bnn, guide)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["net.2"]  # one panel: the head's
    points = AutoDelta(bnn)
    points(x, y)
    with pytest.raises(ValueError, match="plot_std_ratio needs a guide with an independent Normal posterior"):
        plots.plot_std_ratio(bnn, points)


def test_a_history_without_epochs_is_refused_by_name():
    """fit interrupted while choosing the KL weight returns an empty History; plotting it failed in an IndexError."""
    from pyro_bbb.train.history import History

    history = History()
    history.interrupted = True
    with pytest.raises(ValueError, match="no epoch to plot.*interrupted"):
        plots.plot_history(history)
    with pytest.raises(ValueError, match="no epoch to plot: train"):
        plots.plot_history(History())

import matplotlib

matplotlib.use("Agg")

import arviz as az  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import xarray as xr  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.evaluate import export  # noqa: E402
from pyro_bbb.nn import BayesianConv2d, BayesianLinear, BayesianLSTM  # noqa: E402

from ..helpers import Regression  # noqa: E402


def linear_regression(n=60, seed=0, steps=300):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = x @ torch.tensor([1.0, -0.5]) + 0.3 + 0.5 * torch.randn(n, generator=g)
    bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=steps, lr=0.02, progress=False, seed=seed)
    return bnn, guide, x, y


@pytest.fixture(scope="module")
def fitted():
    pyro.clear_param_store()
    return linear_regression()


def test_groups_dims_and_shapes(fitted):
    bnn, guide, x, y = fitted
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=100, num_chains=2)
    assert set(idata.groups()) == {"posterior", "posterior_predictive", "log_likelihood", "observed_data",
                                   "constant_data"}
    assert idata.posterior["net.weight"].dims == ("chain", "draw", "net_out", "net_in")
    assert idata.posterior["net.weight"].shape == (2, 100, 1, 2)
    assert idata.posterior["net.bias"].dims == ("chain", "draw", "net_out")
    assert idata.posterior_predictive["y"].dims == ("chain", "draw", "obs_id")
    assert idata.log_likelihood["y"].shape == (2, 100, 60)
    assert idata.observed_data["y"].dims == ("obs_id",)
    assert idata.constant_data["x"].shape == (60, 2)
    assert not any("dim_0" in d for var in idata.posterior.data_vars.values() for d in var.dims)


def test_log_likelihood_and_predictive_come_from_the_exported_draws(fitted):
    bnn, guide, x, y = fitted
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=500)
    w = torch.as_tensor(idata.posterior["net.weight"].values[0])  # (500, 1, 2)
    b = torch.as_tensor(idata.posterior["net.bias"].values[0])  # (500, 1)
    mean = (w @ x.T).squeeze(1) + b  # (500, 60): the network under each exported draw
    by_hand = torch.distributions.Normal(mean, 0.5).log_prob(y)
    np.testing.assert_allclose(idata.log_likelihood["y"].values[0], by_hand.numpy(), rtol=1e-5, atol=1e-5)
    # the predictive draws are the likelihood around those same means: standardised residuals ~ N(0, 1)
    residual = (torch.as_tensor(idata.posterior_predictive["y"].values[0]) - mean) / 0.5
    assert abs(float(residual.mean())) < 4 / np.sqrt(residual.numel())
    assert abs(float(residual.std()) - 1) < 0.02


def test_loo_and_arviz_summary_and_plots(fitted):
    bnn, guide, x, y = fitted
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=400)
    loo = az.loo(idata, reff=1.0)
    assert np.isfinite(loo.elpd_loo)
    lppd = float(np.log(np.exp(idata.log_likelihood["y"].values[0]).mean(0)).sum())
    assert lppd - 5 < loo.elpd_loo <= lppd  # leave-one-out costs a little on a well-specified 3-weight model
    table = az.summary(idata, kind="stats")
    assert {"net.weight[0, 0]", "net.bias[0]"} <= set(table.index)
    for plot in (lambda: az.plot_posterior(idata, var_names=["net.weight"]), lambda: az.plot_forest(idata),
                 lambda: az.plot_ppc(idata, num_pp_samples=20), lambda: az.plot_loo_pit(idata, y="y")):
        plot()
        plt.close("all")


def test_classification_and_conv_dims():
    net = torch.nn.Sequential(BayesianConv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(-3), BayesianLinear(8, 3))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    x, y = torch.randn(10, 1, 4, 4), torch.randint(0, 3, (10,))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    guide(x, y)
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=20)
    assert idata.posterior["net.0.weight"].dims == ("chain", "draw", "net_0_out", "net_0_in", "net_0_k0", "net_0_k1")
    assert idata.posterior_predictive["y"].values.dtype.kind in "iuf"
    assert idata.log_likelihood["y"].shape == (1, 20, 10)


def test_a_transposed_convolutions_weight_is_named_in_then_out():
    """Its weight is (in_channels, out_channels, kernel): dimension 0 was named out (the bias's dimension, of
    another size), with in = out both were one dimension. Ours and torch's with PyroSample weights alike."""
    from pyro.nn import PyroModule, PyroSample

    from pyro_bbb.nn import BayesianConvTranspose1d

    torch_twin = PyroModule[torch.nn.ConvTranspose1d](2, 5, 3)
    torch_twin.weight = PyroSample(pyro.distributions.Normal(0.0, 1.0).expand([2, 5, 3]).to_event(3))
    for layer in (BayesianConvTranspose1d(2, 5, 3), torch_twin):
        pyro.clear_param_store()
        net = PyroModule[torch.nn.Sequential](layer, torch.nn.Flatten(), BayesianLinear(30, 1))
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(0.5))
        x, y = torch.randn(6, 2, 4), torch.randn(6)
        guide = pyro_bbb.MeanFieldGuide(bnn)
        guide(x, y)
        posterior = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=4).posterior
        assert dict(posterior["net.0.weight"].sizes) == {"chain": 1, "draw": 4, "net_0_in": 2, "net_0_out": 5,
                                                         "net_0_k0": 3}
        if "net.0.bias" in posterior:
            assert dict(posterior["net.0.bias"].sizes) == {"chain": 1, "draw": 4, "net_0_out": 5}


def test_plain_pyro_model_sites_and_size_warning(monkeypatch):
    model = Regression(in_features=3)
    x, y = torch.randn(8, 3), torch.randn(8)
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    idata = pyro_bbb.evaluate.to_inference_data(model, guide, x, num_samples=10, sites=["fc.weight"])
    assert list(idata.posterior.data_vars) == ["fc.weight"]
    assert idata.posterior["fc.weight"].dims == ("chain", "draw", "fc_out", "fc_in")
    assert "log_likelihood" not in idata.groups()
    with pytest.raises(ValueError, match="no latent sites named"):
        pyro_bbb.evaluate.to_inference_data(model, guide, x, sites=["nope"])
    monkeypatch.setattr(export, "LARGE_POSTERIOR_BYTES", 10)
    with pytest.warns(UserWarning, match="sites="):
        pyro_bbb.evaluate.to_inference_data(model, guide, x, num_samples=10)


class LastStep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = BayesianLSTM(3, 5, batch_first=True)
        self.head = BayesianLinear(5, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def test_recurrent_layer_weights_of_different_shapes_get_their_own_dims_under_any_guide():
    from pyro.infer.autoguide import AutoNormal

    bnn = pyro_bbb.BNN(LastStep(), likelihoods.Categorical())
    x, y = torch.randn(12, 6, 3), torch.randint(0, 2, (12,))
    for guide in (pyro_bbb.MeanFieldGuide(bnn), AutoNormal(bnn)):
        pyro.clear_param_store()
        guide(x, y)
        idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=4)
        posterior = idata.posterior
        assert posterior["net.rnn.weight_ih_l0"].dims[2:] == ("net_rnn_weight_ih_l0_out", "net_rnn_weight_ih_l0_in")
        assert posterior.sizes["net_rnn_weight_hh_l0_in"] == 5 and posterior.sizes["net_rnn_weight_ih_l0_in"] == 3
        assert posterior["net.head.weight"].dims[2:] == ("net_head_out", "net_head_in")  # a consistent layer
        assert idata.log_likelihood["y"].shape == (1, 4, 12)


# -- ArviZ 1.x: arviz-base / arviz-stats on an xarray.DataTree ------------------------------------------------------
def test_datatree_for_arviz_1_gives_the_numbers_of_arviz_0(fitted):
    arviz_stats = pytest.importorskip("arviz_stats")
    bnn, guide, x, y = fitted
    pyro.set_rng_seed(3)
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=300, num_chains=2,
                                                container="InferenceData")
    pyro.set_rng_seed(3)
    tree = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=300, num_chains=2, container="DataTree")
    assert isinstance(tree, xr.DataTree) and set(tree.children) == set(idata.groups())
    for group in idata.groups():  # the same draws, variables and dimensions in both containers
        xr.testing.assert_identical(tree[group].to_dataset(), idata[group])
    new, old = arviz_stats.loo(tree), az.loo(idata)
    # the same PSIS-LOO (0.x sums in the draws' float32, 1.x in float64: equal to ~1e-6 relative)
    assert abs(new.elpd - old.elpd_loo) < 1e-3 and abs(new.p - old.p_loo) < 1e-3 and abs(new.se - old.se) < 1e-3
    # Pareto k: arviz-stats estimates the tail shape its own way (values differ by ~0.03), the verdict agrees
    assert np.asarray(new.pareto_k).max() < 0.7 and np.asarray(old.pareto_k).max() < 0.7
    table_new = arviz_stats.summary(tree, var_names=["net.weight", "net.bias"], kind="stats")
    table_old = az.summary(idata, var_names=["net.weight", "net.bias"], kind="stats")
    np.testing.assert_allclose(table_new["mean"].astype(float), table_old["mean"].astype(float), atol=0.011)
    np.testing.assert_allclose(table_new["sd"].astype(float), table_old["sd"].astype(float), atol=0.011)


def test_the_container_follows_the_installed_arviz(fitted, monkeypatch):
    bnn, guide, x, y = fitted
    # ArviZ 0.x
    assert isinstance(pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=5), az.InferenceData)
    monkeypatch.setattr(az, "__version__", "1.0.0")
    assert isinstance(pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=5), xr.DataTree)
    with pytest.raises(ValueError, match='needs ArviZ 0.x .* use container="DataTree"'):
        pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=5, container="InferenceData")
    with pytest.raises(ValueError, match="container must be one of"):
        pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=5, container="netcdf")


def test_a_plate_nested_in_the_data_plate_gives_one_pointwise_log_likelihood_per_datum():
    """Multi-output regression (an "outputs" plate inside the data plate): predictions are (S, N, 3), and the exported
    pointwise log-likelihood is, per draw and datum, the sum over the outputs of the Normal log-density at the
    exported weight draws (computed here by hand), so that az.loo sees one value per datum."""
    import warnings

    from ..helpers import MultiOutput

    model = MultiOutput()
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.1)
    x, y = torch.randn(10, 2), torch.randn(10, 3)
    pyro_bbb.fit(model, guide, (x, y), epochs=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # vectorized, no fallback to one call per draw
        prediction = pyro_bbb.predict(model, guide, x, num_samples=5)
        idata = pyro_bbb.evaluate.to_inference_data(model, guide, x, y, num_samples=5)
    assert prediction.samples.shape == (5, 10, 3)
    weight = torch.as_tensor(idata.posterior["fc.weight"].values[0])  # (draws, 3, 2)
    bias = torch.as_tensor(idata.posterior["fc.bias"].values[0])
    expected = torch.distributions.Normal(x @ weight.transpose(-1, -2) + bias[:, None, :], 0.5).log_prob(y).sum(-1)
    log_lik = torch.as_tensor(idata.log_likelihood["y"].values[0])
    assert log_lik.shape == (5, 10)
    torch.testing.assert_close(log_lik, expected.to(log_lik.dtype), rtol=1e-5, atol=1e-5)
    assert np.isfinite(az.loo(idata, pointwise=True).elpd_loo)


def test_an_autoguides_own_auxiliary_sites_are_not_exported_as_the_models():
    """AutoNormal exported 'likelihood.scale_unconstrained' beside 'likelihood.scale' (az.summary twice the rows), and
    AutoDiagonalNormal its joint '_AutoDiagonalNormal_latent'."""
    from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal

    x, y = torch.randn(20, 2), torch.randn(20)
    bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian())  # a learned noise scale: a constrained site
    for make in (AutoNormal, AutoDiagonalNormal):
        pyro.clear_param_store()
        guide = make(bnn)
        guide(x, y)
        idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=4)
        assert sorted(idata.posterior.data_vars) == ["likelihood.scale", "net.bias", "net.weight"], make.__name__


def test_predicts_warnings_name_the_function_the_user_called():
    from pyro_bbb.evaluate.calibration import fit_temperature
    from pyro_bbb.prediction import UntrainedGuideWarning

    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(2, 3), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(10, 2), torch.randint(0, 3, (10,))
    with pytest.warns(UntrainedGuideWarning, match=r"^to_inference_data: the guide was never trained"):
        pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=4)
    with pytest.warns(UntrainedGuideWarning, match=r"^fit_temperature: the guide was never trained"):
        fit_temperature(bnn, guide, (x, y), num_samples=4)


def test_leave_one_out_of_a_tempered_posterior_is_cautioned_unless_the_rows_are_held_out():
    """A posterior at KL weight w counts every training row 1/w times; az.loo's ratios 1/p(y_i|w) take out only w of
    a row's pull, so its elpd is overstated (exact conjugate LOO at w = 0.1: -19.5 nats, PSIS -16.0) and az.compare
    favoured the tempered posterior without a word. Said at the export; not for rows known to be held out, nor at
    weight 1."""
    import warnings

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 2, generator=g), torch.randn(40, generator=g)
    held_out = torch.randn(10, 2, generator=g)
    for weight in (0.1, 4.0, 1):
        pyro.clear_param_store()
        bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
        guide = pyro_bbb.MeanFieldGuide(bnn)
        pyro_bbb.fit(bnn, guide, (x, y), epochs=2, kl_weight=weight, progress=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            export.to_inference_data(bnn, guide, x, y, num_samples=20)
            export.to_inference_data(bnn, guide, held_out, y[:10], num_samples=20)
            export.to_inference_data(bnn, guide, x, num_samples=20)  # (no log_likelihood without y)
        cautions = [w for w in caught if "az.loo" in str(w.message)]
        if weight == 1:
            assert cautions == []
        else:  # (a weight above 1 counts a row less than once: its elpd is understated)
            assert len(cautions) == 1 and f"tempered (KL weight {weight:g})" in str(cautions[0].message)
            assert ("overstate" if weight < 1 else "understate") in str(cautions[0].message)
            assert cautions[0].filename == __file__


def test_targets_that_do_not_pair_with_the_rows_are_refused_before_any_draw(fitted):
    bnn, guide, x, y = fitted
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"x has 60 rows but y has 59"):
        export.to_inference_data(bnn, guide, x, y[:59], num_samples=5)
    assert torch.equal(torch.rand(3), expected)


def test_a_hand_written_models_data_plate_is_named_to_the_export_and_the_error_names_the_argument():
    """The error told the user to pass data_plate=, which to_inference_data did not take, and said "predict"."""
    import pyro.distributions as dist
    from pyro.infer.autoguide import AutoNormal

    pyro.clear_param_store()
    x, y = torch.randn(20, 2), torch.randn(20)

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        with pyro.plate("obs", len(x)):
            pyro.sample("y", dist.Normal(x @ w, 0.3), obs=y)

    guide = AutoNormal(model)
    guide(x, y)
    with pytest.raises(ValueError, match=r"^to_inference_data needs.*to_inference_data\(\.\.\., data_plate="):
        export.to_inference_data(model, guide, x, y, num_samples=4)
    data = export.to_inference_data(model, guide, x, y, num_samples=4, data_plate="obs")
    assert data["log_likelihood"]["y"].shape == (1, 4, 20)

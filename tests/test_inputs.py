"""What users naturally pass: numpy, dtypes, (N, 1) targets, numpy integers, torch distributions,
a renamed data plate, conditioned weights, guides set up without targets."""

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.nn import PyroModule

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb._inputs import as_tensor, cast_inputs, num_rows, select_rows, split_rows, targets_like
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.prediction.predictive import UntrainedGuideWarning


def regression_data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x.sum(-1) + 0.3 * torch.randn(n, generator=g)


def bnn(likelihood=None):
    return pyro_bbb.BNN(BayesianLinear(2, 1), likelihood or likelihoods.Gaussian(scale=0.3))


def test_n_by_1_targets_give_the_same_fit_metrics_and_export_as_n_targets():
    x, y = regression_data()
    results = []
    for targets in (y, y.unsqueeze(-1)):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = bnn()
        guide = pyro_bbb.MeanFieldGuide(model)
        history = pyro_bbb.fit(model, guide, (x, targets), epochs=3, batch_size=16, progress=False, seed=0,
                               validation_data=(x, targets))
        pyro.set_rng_seed(1)
        pred = pyro_bbb.predict(model, guide, x, num_samples=20)
        idata = pyro_bbb.evaluate.to_inference_data(model, guide, x, targets, num_samples=10)
        results.append((history["loss"], metrics.rmse(pred, targets), metrics.log_likelihood(pred, targets),
                        metrics.interval_coverage(pred, targets), idata.log_likelihood["y"].values))
    (loss_a, rmse_a, ll_a, cov_a, lik_a), (loss_b, rmse_b, ll_b, cov_b, lik_b) = results
    assert loss_a == loss_b and rmse_a == rmse_b and ll_a == ll_b and cov_a == cov_b
    np.testing.assert_array_equal(lik_a, lik_b)
    # the silent wrong number of broadcasting (N,) against (N, 1): an (N, N) error matrix
    assert rmse_a == pytest.approx(float((pred.mean - y).pow(2).mean().sqrt()))


def test_n_by_1_class_labels_are_accepted():
    x = torch.randn(30, 2)
    labels = (x[:, 0] > 0).long()
    model = pyro_bbb.BNN(BayesianLinear(2, 2), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, labels.unsqueeze(-1)), epochs=2, progress=False)
    pred = pyro_bbb.predict(model, guide, x, num_samples=5)
    assert metrics.accuracy(pred, labels.unsqueeze(-1)) == metrics.accuracy(pred, labels)


def test_numpy_and_float64_inputs_work_everywhere():
    x, y = regression_data()
    model = bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    xn, yn = x.double().numpy(), y.double().numpy()
    pyro_bbb.fit(model, guide, (xn, yn), epochs=2, progress=False, validation_data=(xn, yn))
    pred = pyro_bbb.predict(model, guide, xn, num_samples=5)
    assert pred.mean.dtype == torch.float32
    assert np.isfinite(metrics.rmse(pred, yn))
    pyro_bbb.evaluate.to_inference_data(model, guide, xn, yn, num_samples=5)


def test_integer_inputs_to_a_float_model_name_both_dtypes():
    model = bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(TypeError, match=r"torch.int64 but its weights are torch.float32"):
        pyro_bbb.fit(model, guide, (torch.ones(10, 2, dtype=torch.long), torch.zeros(10)), epochs=1, progress=False)


def test_other_types_are_a_clear_type_error():
    model = bnn()
    with pytest.raises(TypeError, match="tensors or numpy arrays"):
        pyro_bbb.fit(model, pyro_bbb.MeanFieldGuide(model), ([[0.0, 1.0]], [0.0]), epochs=1, progress=False)
    with pytest.raises(TypeError, match="numpy array, got list"):
        as_tensor([1.0], "x")


def test_numpy_integer_num_data_and_bad_init_scales():
    assert pyro_bbb.ELBO(num_data=np.int64(200)).num_data == 200
    model = bnn()
    for bad in (float("inf"), True, float("nan"), 0.0):
        with pytest.raises(ValueError, match="init_scale"):
            pyro_bbb.MeanFieldGuide(model, init_scale=bad)


def test_a_torch_distributions_prior_works_like_pyros():
    x, y = regression_data(10)
    losses = []
    for prior in (torch.distributions.Normal(0.0, 2.0), dist.Normal(0.0, 2.0)):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = pyro_bbb.BNN(BayesianLinear(2, 1, prior=prior), likelihoods.Gaussian(scale=0.3))
        guide = pyro_bbb.MeanFieldGuide(model)
        guide(x, y)
        pyro.set_rng_seed(0)
        losses.append(pyro_bbb.ELBO(num_data=10).loss(model, guide, x, y))
    assert losses[0] == losses[1]


class Hand(PyroModule):
    """A hand-written regression; ``inside=True`` runs the layer inside the data plate (a mistake)."""

    def __init__(self, inside=False, plate="batch"):
        super().__init__()
        self.fc1 = BayesianLinear(2, 1)
        self.inside, self.plate = inside, plate

    def forward(self, x, y=None):
        mean = None if self.inside else self.fc1(x).squeeze(-1)
        with pyro.plate(self.plate, x.shape[0]):
            if mean is None:
                mean = self.fc1(x).squeeze(-1)
            return pyro.sample("y", dist.Normal(mean, 0.3), obs=y)


def test_the_layer_inside_the_plate_guard_follows_the_configured_data_plate():
    x, y = regression_data(10)
    model = Hand(inside=True, plate="batch")
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match=r"inside pyro.plate\('batch'\)"):
        pyro_bbb.ELBO(num_data=10, data_plate="batch").loss(model, guide, x, y)
    # a BNN with data_plate="batch" trains and predicts
    model = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.3), data_plate="batch")
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=2, progress=False)
    assert pyro_bbb.predict(model, guide, x, num_samples=4).mean.shape == (10,)


def test_conditioning_a_global_weight_is_not_an_unscaled_likelihood():
    x, y = regression_data(20)
    model = Hand(plate="data")
    w = torch.tensor([[1.0, 1.0]])
    conditioned = poutine.condition(model, {"fc1.weight": w})
    guide = pyro_bbb.MeanFieldGuide(conditioned)
    elbo = pyro_bbb.ELBO(num_data=100)
    elbo.loss(conditioned, guide, x[:5], y[:5])
    assert list(elbo.last_terms["kl_by_site"]) == ["fc1.bias"]
    # a real likelihood outside the plate is still refused
    def unscaled(x, y=None):
        return pyro.sample("y", dist.Normal(torch.zeros(len(x)), 1.0).to_event(1), obs=y)

    with pytest.raises(ValueError, match="not inside pyro.plate"):
        pyro_bbb.ELBO(num_data=100).loss(unscaled, lambda x, y=None: None, x, y)


def test_predict_sets_up_a_guide_that_has_not_seen_the_model_and_leaves_the_rng_alone():
    x = torch.randn(8, 2)
    model = pyro_bbb.BNN(BayesianLinear(2, 3, prior=pyro_bbb.priors.Moped(0.1)), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(model)
    state = torch.get_rng_state()
    pyro_bbb.prediction.set_up_guide(model, guide, x[:1])
    assert torch.equal(torch.get_rng_state(), state)
    pyro.clear_param_store()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.warns(UntrainedGuideWarning, match="never trained"):
        pred = pyro_bbb.predict(model, guide, x, num_samples=5)
    assert pred.probs.shape == (8, 3)
    # set up from inputs alone, the observation stayed an observation: fit continues from here
    pyro_bbb.fit(model, guide, (x, torch.zeros(8, dtype=torch.long)), epochs=1, progress=False)


def test_fit_after_a_guide_was_set_up_without_targets_is_a_clear_error():
    x, y = regression_data(10)
    model = bnn()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x)  # y=None: Pyro takes y for a latent
    with pytest.raises(ValueError, match="set up by a call without targets"):
        pyro_bbb.fit(model, guide, (x, y), epochs=1, progress=False)


def test_helpers():
    assert targets_like(torch.zeros(3, 1), (3,)).shape == (3,)
    assert targets_like(torch.zeros(3, 2), (3,)).shape == (3, 2)
    assert cast_inputs(torch.zeros(2, dtype=torch.long), torch.float32).dtype == torch.long


# -- inputs beyond one tensor -------------------------------------------------------------------------
class Concatenated(torch.nn.Module):
    """The same Bayesian layer read from one tensor, from a tuple (net(a, b)) or from a dict (net(a=..., b=...))."""

    def __init__(self):
        super().__init__()
        self.fc = BayesianLinear(3, 1)

    def forward(self, a, b=None):
        return self.fc(a if b is None else torch.cat([a, b.unsqueeze(-1)], -1))


def split_inputs(x, kind):
    if kind == "tensor":
        return x
    a, b = x[:, :2], x[:, 2]
    return (a, b) if kind == "tuple" else {"a": a, "b": b}


def run_everything(kind, x, y, tmp_path):
    """fit (shuffled minibatches), predict (chunks, vectorized and looped), export and save/load on one input kind."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = pyro_bbb.BNN(Concatenated(), likelihoods.Gaussian(scale=0.3))
    guide = pyro_bbb.MeanFieldGuide(model)
    inputs = split_inputs(x, kind)
    history = pyro_bbb.fit(model, guide, (inputs, y), epochs=4, batch_size=16, progress=False, seed=0,
                           validation_data=(inputs, y))
    pyro.set_rng_seed(1)
    vectorized = pyro_bbb.predict(model, guide, inputs, num_samples=30, batch_size=7, vectorize=True)
    pyro.set_rng_seed(1)
    looped = pyro_bbb.predict(model, guide, inputs, num_samples=30, batch_size=7, vectorize=False)
    torch.testing.assert_close(vectorized.mean, looped.mean)
    idata = pyro_bbb.evaluate.to_inference_data(model, guide, inputs, y, num_samples=10)
    path = tmp_path / f"{kind}.pt"
    pyro_bbb.save(path, model, guide)
    pyro.clear_param_store()
    fresh_model = pyro_bbb.BNN(Concatenated(), likelihoods.Gaussian(scale=0.3))
    fresh = pyro_bbb.load(path, fresh_model, pyro_bbb.MeanFieldGuide(fresh_model))
    return history, vectorized, idata, fresh.site_posteriors()["net.fc.weight"].loc


def test_tuple_and_dict_inputs_give_what_one_tensor_gives(tmp_path):
    x, y = torch.randn(45, 3), torch.randn(45)
    reference = run_everything("tensor", x, y, tmp_path)
    for kind in ("tuple", "dict"):
        history, prediction, idata, loaded = run_everything(kind, x, y, tmp_path)
        assert history["loss"] == reference[0]["loss"]
        assert history["val_log_likelihood"] == reference[0]["val_log_likelihood"]
        torch.testing.assert_close(prediction.mean, reference[1].mean)
        torch.testing.assert_close(loaded, reference[3])
        np.testing.assert_allclose(idata.log_likelihood["y"].values, reference[2].log_likelihood["y"].values, rtol=1e-5)
        names = {"tuple": ["x_0", "x_1"], "dict": ["x_a", "x_b"]}[kind]
        assert sorted(idata.constant_data.data_vars) == names
        assert idata.constant_data[names[0]].dims == ("obs_id", f"{names[0]}_0")


def test_a_dataloader_of_dict_inputs_trains():
    class Pairs(torch.utils.data.Dataset):
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"a": self.x[i, :2], "b": self.x[i, 2]}, self.y[i]

    x = torch.randn(64, 3)
    y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.1 * torch.randn(64)
    model = pyro_bbb.BNN(Concatenated(), likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    loader = torch.utils.data.DataLoader(Pairs(x, y), batch_size=16, shuffle=True)
    history = pyro_bbb.fit(model, guide, loader, epochs=30, lr=0.05, progress=False, seed=0)
    assert history.last["num_data"] == 64
    assert history["nll"][-1] < 0.2 * history["nll"][0]


def test_structured_inputs_errors_name_the_tensor_and_change_nothing():
    model = pyro_bbb.BNN(Concatenated(), likelihoods.Gaussian(scale=0.3))
    guide = pyro_bbb.MeanFieldGuide(model)
    y = torch.randn(10)
    with pytest.raises(ValueError, match=r"share their first dimension.*x\['a'\]: \(10, 2\), x\['b'\]: \(9,\)"):
        pyro_bbb.fit(model, guide, ({"a": torch.randn(10, 2), "b": torch.randn(9)}, y), epochs=1, progress=False)
    with pytest.raises(TypeError, match=r"x\['b'\] is a str"):
        pyro_bbb.fit(model, guide, ({"a": torch.randn(10, 2), "b": "text"}, y), epochs=1, progress=False)
    bad = torch.randn(10)
    bad[3] = float("nan")
    with pytest.raises(ValueError, match=r"x\[1\] contains 1 NaN"):
        pyro_bbb.fit(model, guide, ((torch.randn(10, 2), bad), y), epochs=1, progress=False)
    assert not pyro.get_param_store().keys()  # nothing was set up or changed
    with pytest.raises(ValueError, match=r"x has 10 rows but y has shape \(9,\)"):
        pyro_bbb.fit(model, guide, ((torch.randn(10, 2), torch.randn(10)), y[:9]), epochs=1, progress=False)
    with pytest.raises(ValueError, match="share their first dimension"):
        pyro_bbb.predict(model, guide, (torch.randn(4, 2), torch.randn(3)), num_samples=2)
    with pytest.raises(ValueError, match="empty tuple"):
        pyro_bbb.predict(model, guide, (), num_samples=2)


def test_structured_input_helpers():
    x = {"ids": np.arange(6).reshape(3, 2), "mask": torch.ones(3, 2, dtype=torch.float64)}
    cast = cast_inputs(x, torch.float32)
    assert cast["ids"].dtype == torch.int64 and cast["mask"].dtype == torch.float32  # token ids are never cast
    assert [chunk["ids"].shape[0] for chunk in split_rows(cast, 2)] == [2, 1]
    assert num_rows([torch.zeros(5), torch.zeros(5, 3)]) == 5
    assert isinstance(select_rows([torch.zeros(5)], slice(0, 2)), list)
    with pytest.raises(ValueError, match="first dimension over the data"):
        num_rows((torch.zeros(3), torch.tensor(1.0)))


def test_numpy_float_class_labels_are_told_the_numpy_conversion():
    """Labels from a numpy float array (a common pandas/sklearn leftover) are refused before any step, with the fix
    for a numpy array (``.astype(int)``), not only torch's ``.long()``; nothing changes."""
    x, y = np.random.randn(20, 3).astype(np.float32), np.random.randint(0, 2, 20).astype(np.float64)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 2), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    with pytest.raises(ValueError, match=r"`y.astype\(int\)` \(a numpy array\)"):
        pyro_bbb.fit(bnn, guide, (x, y), epochs=1, progress=False)
    pyro_bbb.fit(bnn, guide, (x, y.astype(int)), epochs=1, progress=False)

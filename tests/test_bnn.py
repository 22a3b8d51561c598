import math
import warnings
from types import SimpleNamespace

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear


def mixed_net():
    return torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def test_sites_weights_outside_and_observation_inside_the_data_plate():
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.1))
    tr = poutine.trace(bnn).get_trace(torch.randn(4, 3), torch.randn(4))
    assert tr.nodes["net.0.weight"]["cond_indep_stack"] == ()
    assert [f.name for f in tr.nodes["y"]["cond_indep_stack"]] == ["data"]
    assert tr.nodes["net.2.weight"]["type"] == "param"  # the deterministic layer is a point estimate


def test_loss_equals_pyros_mean_field_elbo_on_the_full_batch():
    """With B = N the scaling is 1: our ELBO must equal Pyro's TraceMeanField_ELBO for the same guide draw."""
    x, y = torch.randn(20, 3), torch.randn(20)
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.5), num_data=20)   # the full batch, said so
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.1)
    guide(x, y)
    pyro.set_rng_seed(3)
    ours = pyro_bbb.ELBO(num_data=20).loss(bnn, guide, x, y)
    pyro.set_rng_seed(3)
    reference = TraceMeanField_ELBO().loss(bnn, guide, x, y)
    assert ours == pytest.approx(reference, rel=1e-5)


def test_plain_svi_trains_deterministic_and_bayesian_parts():
    x, y = torch.randn(32, 3), torch.randn(32)
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.05}), pyro_bbb.ELBO(num_data=100))
    svi.step(x, y)
    store = pyro.get_param_store()
    before = {k: v.detach().clone() for k, v in store.items()}
    svi.step(x, y)
    assert not torch.equal(before["net.2.weight"], store["net.2.weight"])
    assert not torch.equal(before["MeanFieldGuide.locs.net.0.weight"], store["MeanFieldGuide.locs.net.0.weight"])


def test_a_converted_net_called_on_its_own_before_bnn_is_a_clear_error_that_changes_nothing():
    """bayesianize returns a PyroModule; tried on a batch first, BNN(net, ...) failed in Pyro's 'AssertionError:
    submodule net has executed outside of supermodule', after converting the net's frozen parameters to buffers."""
    net = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1)))
    net(torch.randn(4, 3))
    names = [name for name, _ in net.named_parameters()] + [name for name, _ in net.named_buffers()]
    with pytest.raises(ValueError, match=r"has been called on its own already.*Wrap it in pyro_bbb.BNN before "
                                         r"calling it"):
        pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))
    assert [name for name, _ in net.named_parameters()] + [name for name, _ in net.named_buffers()] == names
    fresh = pyro_bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1)))
    bnn = pyro_bbb.BNN(fresh, likelihoods.Gaussian(scale=0.1))
    assert bnn.net(torch.randn(4, 3)).shape == (4, 1)
    lone = BayesianLinear(3, 1)  # a lone layer tried first: Pyro renames it, and BNN takes it as before
    lone(torch.randn(4, 3))
    assert pyro_bbb.BNN(lone, likelihoods.Gaussian(scale=0.1)).net is lone


def test_rejects_bad_arguments():
    with pytest.raises(TypeError, match="Likelihood"):
        pyro_bbb.BNN(mixed_net(), torch.nn.MSELoss())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        pyro_bbb.BNN(lambda x: x, likelihoods.Gaussian())
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian())
    with pytest.raises(ValueError, match="3 rows but y has 4"):
        bnn(torch.randn(3, 3), torch.randn(4))


@pytest.mark.parametrize("elbo", [pyro_bbb.ELBO, pyro.infer.Trace_ELBO])
def test_an_empty_batch_in_a_pyro_loop_is_refused_by_name_and_changes_nothing(elbo):
    """Pyro's plate divided N by a subsample of 0 rows: a bare ZeroDivisionError."""
    x, y = torch.randn(30, 3), torch.randn(30)
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=0.5), num_data=30)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.05}), elbo())
    svi.step(x[:5], y[:5])
    before = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    with pytest.raises(ValueError, match="0 rows: an empty batch"):
        svi.step(x[:0], y[:0])
    assert all(torch.equal(before[k], v) for k, v in pyro.get_param_store().items())


@pytest.mark.parametrize("loop", ["fit", "pyro svi"])
def test_a_frozen_layer_stays_frozen(loop):
    """A PyroModule lifts every parameter into Pyro's param store, which makes it trainable: a frozen (pretrained)
    layer, left deterministic as bayesianize advises, was trained (requires_grad True again, its weight moved)."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), BayesianLinear(8, 1))
    net[0].requires_grad_(False)
    frozen = net[0].weight.detach().clone()
    keys = set(net.state_dict())
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(64, 3), torch.randn(64)
    if loop == "fit":
        pyro_bbb.fit(bnn, guide, (x, y), epochs=3, kl_weight=1, lr=0.1, progress=False)
    else:
        svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.1}), pyro_bbb.ELBO(num_data=64))
        for _ in range(3):
            svi.step(x, y)
    assert torch.equal(bnn.net[0].weight, frozen) and not bnn.net[0].weight.requires_grad
    assert set(bnn.net.state_dict()) == keys  # (the same names: checkpoints load as before)
    assert not any(name.startswith("net.0.") for name in pyro.get_param_store().keys())


def test_a_body_put_in_evaluation_mode_trains_in_it_and_a_model_in_evaluation_mode_trains_whole():
    """fit switched every module to training mode: a pretrained body the user had put in evaluation mode (its batch
    norm statistics frozen) had them moved by the new data. A model left whole in evaluation mode (after a predict
    by hand), or a net put in it before it was wrapped, trains in training mode; each module's mode comes back
    after."""
    x, y = torch.randn(64, 3) * 3 + 2, torch.randn(64)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), BayesianLinear(8, 1))
    net[1].eval()
    statistics = net[1].running_mean.clone()
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    with pytest.warns(UserWarning, match=r"fit trains 'net.1' in evaluation mode, as you left it.*\.train\(\)"):
        pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=2, kl_weight=1, progress=False)
    assert torch.equal(net[1].running_mean, statistics) and not net[1].training and net[0].training

    for evaluation_mode in (bnn, net):  # the model, or a net put in evaluation mode before it was wrapped
        pyro.clear_param_store()
        bnn.train()
        evaluation_mode.eval()
        statistics = net[1].running_mean.clone()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "fit trains")  # (nothing left in evaluation mode: nothing said)
            pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=2, kl_weight=1, progress=False)
        assert not torch.equal(net[1].running_mean, statistics)  # trained in training mode
        assert not any(module.training for module in evaluation_mode.modules())  # and put back


def test_a_tied_frozen_weight_stays_one_tensor_through_to_and_a_refused_bnn_leaves_the_net_as_it_was():
    """Torch converts each module's buffers apart: a frozen weight two layers share came apart after .double().
    A BNN refused for a bad num_data had already turned the net's frozen parameters into buffers."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), BayesianLinear(4, 1))
    net[2].weight = net[0].weight
    net[0].weight.requires_grad_(False)
    with pytest.raises(ValueError, match="num_data"):
        pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5), num_data=-5)
    assert "0.weight" in dict(net.named_parameters())
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5)).double()
    assert bnn.net[0].weight is bnn.net[2].weight and bnn.net[0].weight.dtype == torch.float64
    with torch.no_grad():
        bnn.net[0].weight.add_(1.0)
    assert torch.equal(bnn.net[2].weight, bnn.net[0].weight)


def test_custom_data_plate_name():
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=1.0), data_plate="obs")
    tr = poutine.trace(bnn).get_trace(torch.randn(4, 3), torch.randn(4))
    assert [f.name for f in tr.nodes["y"]["cond_indep_stack"]] == ["obs"]
    elbo = pyro_bbb.ELBO(num_data=40, data_plate="obs")
    elbo.loss(bnn, pyro_bbb.MeanFieldGuide(bnn), torch.randn(4, 3), torch.randn(4))
    assert (elbo.last_terms["num_data"], elbo.last_terms["batch_size"]) == (40, 4)


def test_pyro_bbb_s_elbo_reads_the_model_s_own_plate_name_in_a_pyro_svi_loop():
    """BNN(..., data_plate="obs") with ELBO(num_data=N) and no plate named: the same steps as under "data"."""
    x, y = torch.randn(40, 3), torch.randn(40)
    losses, terms = {}, {}
    for plate in ("data", "obs"):
        pyro.clear_param_store()
        torch.manual_seed(0)
        bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(scale=1.0), data_plate=plate)
        guide = pyro_bbb.MeanFieldGuide(bnn)
        elbo = pyro_bbb.ELBO(num_data=40)
        svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
        pyro.set_rng_seed(1)
        losses[plate] = [svi.step(x[i:i + 8], y[i:i + 8]) for i in range(0, 40, 8)]
        terms[plate] = elbo.last_terms["num_data"], elbo.last_terms["batch_size"]
    assert losses["obs"] == losses["data"] and terms["obs"] == terms["data"] == (40, 8)
    assert elbo.data_plate == "obs"  # the name it read at its last call


def test_an_elbo_s_data_plate_set_by_hand_is_kept_over_the_model_s():
    x, y = torch.randn(8, 3), torch.randn(8)
    layer = BayesianLinear(3, 1)

    def model(x, y):  # a plain function: no data_plate attribute to read
        mean = layer(x).squeeze(-1)
        with pyro.plate("rows", x.shape[0]):
            pyro.sample("y", pyro.distributions.Normal(mean, 1.0), obs=y)

    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    elbo = pyro_bbb.ELBO(num_data=40)
    with pytest.raises(ValueError, match=r"not inside pyro.plate\('data'"):
        elbo.loss(model, guide, x, y)
    elbo.data_plate = "rows"
    for _ in range(2):  # (kept from call to call)
        elbo.loss(model, guide, x, y)
        assert elbo.data_plate == "rows" and elbo.last_terms["num_data"] == 40


class Wrapped(torch.nn.Module):
    """A net whose output is not a tensor: like a transformers model (``.logits``), an RNN (a tuple), or neither."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.fc = BayesianLinear(3, 2)

    def forward(self, x):
        out = self.fc(x)
        if self.kind == "object":
            return SimpleNamespace(logits=out, hidden_states=None)
        if self.kind == "dict":
            return {"loss": None, "logits": out}
        if self.kind == "tuple":
            return out, torch.zeros(())
        return {"prediction": out}


@pytest.mark.parametrize("kind", ["object", "dict", "tuple"])
def test_the_output_adapter_finds_the_logits(kind):
    bnn = pyro_bbb.BNN(Wrapped(kind), likelihoods.Categorical())
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False, seed=0)
    pyro.set_rng_seed(0)
    prediction = pyro_bbb.predict(bnn, guide, x, num_samples=5, vectorize=True)  # adapted on folded draws too
    assert prediction.probs.shape == (6, 2)
    # the likelihood reads the net's logits under the same draws
    draws = poutine.trace(guide).get_trace(x)
    trace = poutine.trace(poutine.replay(bnn, trace=draws)).get_trace(x)
    logits = trace.nodes["y"]["fn"].logits
    w, b = draws.nodes["net.fc.weight"]["value"], draws.nodes["net.fc.bias"]["value"]
    torch.testing.assert_close(logits, torch.log_softmax(x @ w.T + b, -1))


def test_an_output_without_a_tensor_needs_an_adapter():
    bnn = pyro_bbb.BNN(Wrapped("other"), likelihoods.Categorical())
    with pytest.raises(TypeError, match="the net returned a dict; .* output_adapter="):
        bnn(torch.randn(4, 3))
    adapted = pyro_bbb.BNN(Wrapped("other"), likelihoods.Categorical(), output_adapter=lambda out: out["prediction"])
    assert adapted(torch.randn(4, 3)).shape == (4,)
    with pytest.raises(TypeError, match="output_adapter must be callable"):
        pyro_bbb.BNN(Wrapped("other"), likelihoods.Categorical(), output_adapter="prediction")


# Pyro's own ELBOs on minibatches: a BNN that knows N declares its data plate with it; one that does not warns.

def _pyro_elbo_setup(num_data, seed=0):
    pyro.clear_param_store()
    torch.manual_seed(seed)
    net = torch.nn.Sequential(BayesianLinear(3, 4), torch.nn.Tanh(), BayesianLinear(4, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(0.5), num_data=num_data)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(16, 3), torch.randn(16)
    guide(x, y)
    return bnn, guide, x, y


def _loss_and_grads(elbo, num_data):
    """The loss and the gradient of every parameter (flattened, by name) of one call, on a fixed draw."""
    bnn, guide, x, y = _pyro_elbo_setup(num_data)
    pyro.set_rng_seed(3)
    with poutine.trace(param_only=True) as capture:
        loss = elbo.loss_and_grads(bnn, guide, x, y)
    params = {name: site["value"].unconstrained() for name, site in capture.trace.nodes.items()}
    return loss, torch.cat([params[name].grad.flatten() for name in sorted(params)])


def test_pyros_analytic_kl_elbo_on_a_batch_equals_ours_exactly_when_the_model_knows_n():
    """Both use the closed-form KL and the same draw: loss and gradients equal to float precision, with the
    batch of 16 scaled to N = 200 by the model's plate (ours: by the ELBO's num_data)."""
    ours_loss, ours_grads = _loss_and_grads(pyro_bbb.ELBO(num_data=200), None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # N is known: not a word
        loss, grads = _loss_and_grads(TraceMeanField_ELBO(), 200)
    assert loss == pytest.approx(ours_loss, rel=1e-6)
    torch.testing.assert_close(grads, ours_grads, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("elbo_class", [pyro.infer.Trace_ELBO, pyro.infer.TraceGraph_ELBO, pyro.infer.JitTrace_ELBO,
                                        pyro.infer.JitTraceMeanField_ELBO])
def test_pyros_other_elbos_on_a_batch_equal_ours_in_expectation_when_the_model_knows_n(elbo_class):
    """A Monte Carlo KL (or, under the JIT, other draws): equal in expectation. 4000 vectorized particles each: the
    loss within 0.1% (measured 6e-5), the gradient within 1% in norm (measured under 1e-5); without N the loss is off
    by 75% and the gradient by 92% (the control that shows the test can fail)."""
    options = {"num_particles": 4000, "vectorize_particles": True}
    ours_loss, ours_grads = _loss_and_grads(pyro_bbb.ELBO(num_data=200, **options), None)
    loss, grads = _loss_and_grads(elbo_class(**options), 200)
    assert loss == pytest.approx(ours_loss, rel=1e-3)
    assert float((grads - ours_grads).norm() / ours_grads.norm()) < 0.01
    with pytest.warns(UserWarning, match="num_data"):
        unscaled_loss, unscaled_grads = _loss_and_grads(elbo_class(**options), None)
    assert abs(unscaled_loss - ours_loss) / ours_loss > 0.5
    assert float((unscaled_grads - ours_grads).norm() / ours_grads.norm()) > 0.5


def test_renyi_elbo_on_a_batch_equals_ours_in_expectation_when_the_model_knows_n():
    """RenyiELBO with one particle (its default is two: a tighter, importance-weighted bound) is the ELBO: the mean
    of 400 single-draw losses within 4 standard errors of ours (4000 particles)."""
    ours = pyro_bbb.ELBO(num_data=200, num_particles=4000, vectorize_particles=True)
    bnn, guide, x, y = _pyro_elbo_setup(None)
    reference = ours.loss(bnn, guide, x, y)
    bnn.num_data = 200
    pyro.set_rng_seed(5)
    losses = torch.tensor([pyro.infer.RenyiELBO(alpha=0.0, num_particles=1).loss(bnn, guide, x, y) for _ in range(400)])
    standard_error = float(losses.std() / 400 ** 0.5)
    assert abs(float(losses.mean()) - reference) < 4 * standard_error
    bnn.num_data = None
    with pytest.warns(UserWarning, match="num_data"):  # a step (its loss() runs without gradients: no step, no word)
        unscaled = pyro.infer.RenyiELBO(alpha=0.0, num_particles=1).loss_and_grads(bnn, guide, x, y)
    assert abs(unscaled - reference) > 50 * standard_error


def test_a_bnn_without_n_warns_once_before_pyros_elbo_first_changes_a_parameter():
    bnn, guide, x, y = _pyro_elbo_setup(None)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())

    with pytest.warns(UserWarning, match=r"BNN\(\.\.\., num_data=N\).*16 rows") as record:
        svi.step(x, y)
        svi.step(x, y)
    assert sum("num_data" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ours, fit, predict, save and Pyro's Predictive: never a word
        fresh, fresh_guide, _, _ = _pyro_elbo_setup(None)
        pyro_bbb.ELBO(num_data=100).loss(fresh, fresh_guide, x, y)
        pyro_bbb.ELBO().loss(fresh, fresh_guide, x, y)
        pyro_bbb.fit(fresh, fresh_guide, (x, y), epochs=1, batch_size=8, kl_weight=1.0, progress=False)
        pyro_bbb.predict(fresh, fresh_guide, x, num_samples=3)
        pyro.infer.Predictive(fresh, guide=fresh_guide, num_samples=3)(x)
        pyro.infer.Predictive(fresh, guide=fresh_guide, num_samples=3)(x, y)


def test_a_bnn_without_n_warns_under_pyro_bbbs_elbo_without_n_too():
    """pyro_bbb.ELBO() reads N from the model's plate: a BNN that does not know it was trained unscaled in silence."""
    bnn, guide, x, y = _pyro_elbo_setup(None)
    svi = SVI(bnn, guide, pyro_bbb.optim.Adam({"lr": 0.01}), pyro_bbb.ELBO())
    with pytest.warns(UserWarning, match=r"BNN\(\.\.\., num_data=N\).*16 rows") as record:
        svi.step(x, y)
        svi.step(x, y)
    assert sum("num_data" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an ELBO that knows N: no word
        fresh, fresh_guide, _, _ = _pyro_elbo_setup(None)
        SVI(fresh, fresh_guide, pyro_bbb.optim.Adam({"lr": 0.01}), pyro_bbb.ELBO(num_data=100)).step(x, y)


def test_a_bnn_without_n_warns_before_the_step_changes_anything():
    bnn, guide, x, y = _pyro_elbo_setup(None)
    store = pyro.get_param_store()
    before = {name: value.detach().clone() for name, value in store.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="num_data"):  # a user who turns warnings into errors loses nothing
            SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO()).step(x, y)
    assert all(torch.equal(before[name], store[name].detach()) for name in before)


def test_the_objectives_n_wins_and_prediction_is_unchanged_by_the_models_n():
    bnn, guide, x, y = _pyro_elbo_setup(200)
    elbo = pyro_bbb.ELBO(num_data=50)   # fit's selection trains on a split: its N, not the model's
    elbo.loss(bnn, guide, x, y)
    assert elbo.last_terms["num_data"] == 50
    elbo = pyro_bbb.ELBO()              # an ELBO without N reads the model's declared plate
    elbo.loss(bnn, guide, x, y)
    assert elbo.last_terms["num_data"] == 200
    pyro.set_rng_seed(0)
    with_n = pyro_bbb.predict(bnn, guide, x, num_samples=5).mean
    bnn.num_data = None
    pyro.set_rng_seed(0)
    torch.testing.assert_close(pyro_bbb.predict(bnn, guide, x, num_samples=5).mean, with_n)


def test_a_batch_larger_than_the_models_n_and_a_bad_n_are_refused():
    bnn, guide, x, y = _pyro_elbo_setup(None)
    bnn.num_data = 10
    with pytest.raises(ValueError, match="16 rows is larger than the model's num_data=10"):
        pyro.infer.Trace_ELBO().loss(bnn, guide, x, y)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="num_data"):
            bnn.num_data = bad
    assert bnn.num_data == 10


def test_pyros_autonormal_and_a_dataloader_train_a_bnn_that_knows_n():
    """Another guide, another loop: AutoNormal under Trace_ELBO over a DataLoader's batches, a last batch of 4."""
    x, y = torch.randn(100, 3), torch.randn(100)
    bnn = pyro_bbb.BNN(mixed_net(), likelihoods.Gaussian(0.5), num_data=100)
    guide = pyro.infer.autoguide.AutoNormal(bnn)
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    for xb, yb in loader:
        svi.step(xb, yb)
    trace = poutine.trace(bnn).get_trace(xb, yb)
    assert trace.nodes["y"]["scale"] == 25.0 and len(yb) == 4


@pytest.mark.slow
def test_a_pyro_users_own_minibatch_loop_on_breast_cancer_matches_fit_when_the_model_knows_n():
    """The loop every Pyro tutorial writes (SVI, Trace_ELBO, batches of 64, a 30-50-50 net) on scikit-learn's
    breast-cancer set: with N known its test accuracy is within 2 points of ``fit``'s (measured 0.959 / 0.953);
    without N it warns before its first step changes a parameter."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    features, labels = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(features, labels, test_size=0.3, random_state=0,
                                                        stratify=labels)
    mean, std = x_train.mean(0), x_train.std(0)
    x_train, x_test = (torch.tensor((a - mean) / std, dtype=torch.float32) for a in (x_train, x_test))
    y_train, y_test = torch.tensor(y_train), torch.tensor(y_test)

    def model(num_data=None):
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = torch.nn.Sequential(BayesianLinear(30, 50), torch.nn.ReLU(), BayesianLinear(50, 50), torch.nn.ReLU(),
                                  BayesianLinear(50, 2))
        bnn = pyro_bbb.BNN(net, likelihoods.Categorical(), num_data=num_data)
        return bnn, pyro_bbb.MeanFieldGuide(bnn)

    def accuracy(bnn, guide):
        probs = pyro_bbb.predict(bnn, guide, x_test, num_samples=100).probs
        return float((probs.argmax(-1) == y_test).float().mean())

    bnn, guide = model()
    pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=100, batch_size=64, progress=False)
    fit_accuracy = accuracy(bnn, guide)

    bnn, guide = model(num_data=len(x_train))
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(100):
            order = torch.randperm(len(x_train))
            for start in range(0, len(x_train), 64):
                batch = order[start:start + 64]
                svi.step(x_train[batch], y_train[batch])
    assert abs(accuracy(bnn, guide) - fit_accuracy) <= 0.02
    assert fit_accuracy > 0.93

    bnn, guide = model()
    svi = SVI(bnn, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.Trace_ELBO())
    guide(x_train[:64], y_train[:64])
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="num_data=N"):
            svi.step(x_train[:64], y_train[:64])
    assert all(torch.equal(before[name], pyro.get_param_store()[name].detach()) for name in before)


@pytest.mark.parametrize("which", ["x", "y"])
def test_numpy_data_in_a_pyro_loop_is_a_clear_error_before_anything_changes(which):
    bnn, guide, x, y = _pyro_elbo_setup(16)
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    args = {"x": (x.numpy(), y), "y": (x, y.numpy())}[which]
    with pytest.raises(TypeError, match=rf"{which} is a numpy ndarray.*torch.as_tensor\({which}\)"):
        SVI(bnn, guide, pyro_bbb.optim.Adam({"lr": 0.01}), pyro_bbb.ELBO()).step(*args)
    assert all(torch.equal(before[n], pyro.get_param_store()[n].detach()) for n in before)


def test_a_bnn_that_knows_n_warns_once_under_pyros_older_minibatch_scale():
    """Pyro's older recipe scales the model by N / B; a BNN that declares its data plate with N scales the batch by
    N / B again: the likelihood counted (N / B)^2 times under Pyro's ELBO, without a word. Once, before the first
    step changes anything; not under another scale (a loss per datum), nor when the batch is all the data."""
    bnn, guide, x, y = _pyro_elbo_setup(64)
    scaled = poutine.scale(bnn, scale=64 / 16)
    svi = SVI(scaled, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    with pytest.warns(UserWarning, match=r"poutine.scale of N / B = 4.*\(N / B\)\^2 = 16") as record:
        svi.step(x, y)
        svi.step(x, y)
    assert sum("poutine.scale" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh, fresh_guide, _, _ = _pyro_elbo_setup(64)
        SVI(poutine.scale(fresh, scale=1 / 64), fresh_guide, pyro.optim.Adam({"lr": 0.01}),
            pyro.infer.Trace_ELBO()).step(x, y)
        fresh.num_data = 16  # the whole training set: N / B = 1
        SVI(fresh, fresh_guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO()).step(x, y)


def test_observation_reads_the_guides_draw_of_a_learned_noise_scale():
    """BNN.observation, called outside the module's own call, drew the learned noise scale afresh from its prior
    (0.429 where the guide drew 1.241: log-likelihood -26.8 for -12.2) without a word."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    trace = poutine.trace(guide).get_trace(x, y)
    fn, _ = poutine.replay(bnn.observation, trace=trace)(x, y)
    forward = poutine.trace(poutine.replay(bnn, trace=trace)).get_trace(x, y).nodes["y"]["fn"]
    drawn = trace.nodes["likelihood.scale"]["value"]
    torch.testing.assert_close(fn.scale, drawn.expand_as(fn.scale))
    torch.testing.assert_close(fn.log_prob(y), forward.log_prob(y))


def test_a_frozen_parameter_of_a_likelihood_of_ones_own_stays_as_it_is():
    """A frozen parameter of the net stayed; one of the likelihood was lifted into Pyro's store and trained."""

    class FixedNoise(likelihoods.Likelihood):
        real_valued = True

        def __init__(self):
            super().__init__()
            self.log_scale = torch.nn.Parameter(torch.tensor(0.0), requires_grad=False)

        def distribution(self, output):
            return dist.Normal(output.squeeze(-1), self.log_scale.exp())

    pyro.clear_param_store()
    x = torch.randn(40, 3)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), FixedNoise())
    pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, x.sum(-1)), epochs=5, batch_size=20, kl_weight=1.0,
                 lr=5e-2, progress=False)
    assert float(bnn.likelihood.log_scale) == 0.0 and not bnn.likelihood.log_scale.requires_grad


def test_half_precision_binary_targets_are_scored_in_float32():
    """y.half() kept the Bernoulli's log-likelihood in float16: scaled by N / B it overflowed to inf."""
    pyro.clear_param_store()
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,))
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Bernoulli())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro.set_rng_seed(0)
    half = pyro_bbb.ELBO(num_data=200_000).loss(bnn, guide, x, y.half())
    pyro.set_rng_seed(0)
    full = pyro_bbb.ELBO(num_data=200_000).loss(bnn, guide, x, y.float())
    assert math.isfinite(half) and half == pytest.approx(full, rel=1e-6)


def test_namedtuple_inputs_run_through_fit_and_predict():
    """A namedtuple of inputs ran when the BNN was called, but map_inputs rebuilt it as type(x)(generator): fit and
    predict failed in the namedtuple's constructor."""
    import collections

    Pair = collections.namedtuple("Pair", "a b")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = BayesianLinear(3, 1)

        def forward(self, a, b):
            return self.fc(a * b)

    pyro.clear_param_store()
    x, y = Pair(torch.randn(20, 3), torch.ones(20, 3)), torch.randn(20)
    bnn = pyro_bbb.BNN(Net(), likelihoods.Gaussian(0.3))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=10, kl_weight=1.0, progress=False)
    assert pyro_bbb.predict(bnn, guide, x, num_samples=3).mean.shape == (20,)

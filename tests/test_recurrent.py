import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.nn import BayesianGRU, BayesianGRUCell, BayesianLSTM, BayesianLSTMCell


def conditioned_on_twin(bayesian, twin):
    """The Bayesian layer with every weight site fixed to the deterministic twin's parameter."""
    return poutine.condition(bayesian, data={name: p.detach() for name, p in twin.named_parameters()})


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True}, {"batch_first": True, "bias": False}])
def test_layer_equals_torch_twin_at_the_same_weights(mode, kwargs):
    torch.manual_seed(0)
    twin = getattr(nn, mode)(3, 5, **kwargs)
    bayesian = {"LSTM": BayesianLSTM, "GRU": BayesianGRU}[mode](3, 5, **kwargs)
    x = torch.randn(4, 6, 3) if kwargs.get("batch_first") else torch.randn(6, 4, 3)
    expected = twin(x)
    got = conditioned_on_twin(bayesian, twin)(x)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    if mode == "LSTM":
        torch.testing.assert_close(got[1][0], expected[1][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1][1], expected[1][1], rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_cells_equal_torch_twins(mode):
    torch.manual_seed(0)
    twin = getattr(nn, f"{mode}Cell")(3, 5)
    cell = {"LSTM": BayesianLSTMCell, "GRU": BayesianGRUCell}[mode](3, 5)
    x = torch.randn(4, 3)
    h = (torch.randn(4, 5), torch.randn(4, 5)) if mode == "LSTM" else torch.randn(4, 5)
    expected, got = twin(x, h), conditioned_on_twin(cell, twin)(x, h)
    for a, b in zip(expected if mode == "LSTM" else [expected], got if mode == "LSTM" else [got]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_initial_values_priors_and_sites():
    layer = BayesianLSTM(3, 5, recurrent_prior=priors.Normal(0.0, 0.3))
    assert sorted(layer.bayesian_parameters()) == ["bias_hh_l0", "bias_ih_l0", "weight_hh_l0", "weight_ih_l0"]
    assert layer.bayesian_parameters()["weight_hh_l0"] == priors.Normal(0.0, 0.3)
    assert layer.bayesian_parameters()["weight_ih_l0"] == priors.Normal()
    tr = poutine.trace(layer).get_trace(torch.randn(2, 1, 3))
    assert sorted(tr.stochastic_nodes) == ["bias_hh_l0", "bias_ih_l0", "weight_hh_l0", "weight_ih_l0"]
    fan = BayesianLSTM(3, 5, prior=priors.FanInNormal())
    assert float(fan.prior_distribution("weight_hh_l0").base_dist.scale.reshape(-1)[0]) == pytest.approx(5**-0.5)
    assert float(fan.prior_distribution("weight_ih_l0").base_dist.scale.reshape(-1)[0]) == pytest.approx(3**-0.5)


def test_one_weight_draw_per_sequence_and_vectorized_draws():
    layer = BayesianGRU(3, 4)
    x = torch.randn(7, 2, 3)
    tr = poutine.trace(layer).get_trace(x)
    assert sum(site["type"] == "sample" for site in tr.nodes.values()) == 4  # four sites, each drawn once
    with pyro.plate("draws", 5, dim=-2):
        output, h_n = layer(x)
    assert output.shape == (5, 7, 2, 4) and h_n.shape == (5, 1, 2, 4)


def test_flipout_signs_are_shared_across_time_and_unbiased():
    """Flipout through time: per time step, the mean and spread of the outputs over draws equal those under a
    shared weight draw (signs drawn once per example and reused at every step keep each sequence's distribution)."""
    torch.manual_seed(0)
    layer = BayesianLSTM(2, 3)
    x = torch.randn(5, 4, 2)
    guide = pyro_bbb.MeanFieldGuide(layer, init_scale=0.3)
    guide(x)
    outputs = {}
    for name, handler in (("reparam", None), ("flipout", pyro_bbb.flipout)):
        runs = []
        for _ in range(4):
            with (handler() if handler else poutine.messenger.Messenger()), pyro.plate("draws", 2000, dim=-2):
                trace = poutine.trace(guide).get_trace(x)
                runs.append(poutine.replay(layer, trace=trace)(x)[0].detach())
        outputs[name] = torch.cat(runs)
    mean_r, mean_f = outputs["reparam"].mean(0), outputs["flipout"].mean(0)
    se = ((outputs["reparam"].var(0) + outputs["flipout"].var(0)) / 8000).sqrt()
    assert ((mean_r - mean_f).abs() / se).max() < 5
    var_r, var_f = outputs["reparam"].var(0), outputs["flipout"].var(0)
    torch.testing.assert_close(var_f, var_r, rtol=0.15, atol=1e-4)  # same marginal spread


def test_local_reparameterization_refuses_recurrent_weights():
    layer = BayesianLSTM(2, 3)
    x = torch.randn(5, 4, 2)
    guide = pyro_bbb.MeanFieldGuide(layer)
    guide(x)
    with pytest.raises(ValueError, match="recurrent weights"), pyro_bbb.local_reparameterization():
        poutine.replay(layer, trace=poutine.trace(guide).get_trace(x))(x)


def test_bad_input_shape():
    with pytest.raises(ValueError, match="last dimension is 3"):
        BayesianLSTM(3, 4)(torch.randn(5, 2, 4))
    with pytest.raises(ValueError, match="feed single steps to the cell"):
        BayesianGRU(3, 4)(torch.randn(2, 3))


class LastStep(nn.Module):
    def __init__(self, rnn, hidden):
        super().__init__()
        self.rnn, self.out = rnn, nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(self.rnn(x)[0][..., -1, :])


def test_trains_with_fit_and_flipout_and_clipping():
    torch.manual_seed(0)
    x = torch.randn(64, 6, 2)
    y = (x[:, :, 0].sum(-1) > 0).float()
    bnn = pyro_bbb.BNN(LastStep(BayesianLSTM(2, 4, batch_first=True), 4), likelihoods.Bernoulli())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=30, batch_size=16, lr=0.03, clip_norm=5.0,
                           estimator="flipout", progress=False, seed=0)  # fmt: skip
    assert history["nll"][-1] < 0.6 * history["nll"][0]
    assert math.isfinite(history.last["kl"]) and set(history.last["kl_by_layer"]) == {"net.rnn"}


def test_bayesianize_converts_recurrent_layers_from_their_weights():
    torch.manual_seed(0)
    model = nn.ModuleDict({"lstm": nn.LSTM(3, 4, num_layers=2), "gru": nn.GRUCell(3, 4)})
    converted = pyro_bbb.bayesianize(model)
    assert isinstance(converted["lstm"], BayesianLSTM) and isinstance(converted["gru"], BayesianGRUCell)
    for name, param in model["lstm"].named_parameters():
        torch.testing.assert_close(getattr(converted["lstm"], f"{name}_init"), param.detach())
    with pytest.raises(ValueError, match="proj_size"):
        pyro_bbb.bayesianize(nn.LSTM(3, 4, proj_size=2))


@pytest.mark.slow
def test_embedded_reber_bayesian_lstm_matches_the_deterministic_one():
    """The user report: a Bayesian LSTM(4) on the Embedded Reber Grammar stayed at 50% accuracy. With the KL scaled
    by pyro_bbb.ELBO, gradient clipping and Flipout it reaches the deterministic LSTM(4)'s accuracy.

    Protocol (both models alike): 5000 training strings, 30 epochs, batches of 32, Adam 0.01, clip_norm 5; best
    validation accuracy over the epochs and over three restarts (a tiny LSTM(4) sometimes settles in a worse basin:
    over four seeds the Bayesian one reached 0.90-0.99, the deterministic one 0.97-0.98; multithreaded float sums
    differ in the last digit from run to run, enough to move one seed between basins -- seed 0 gave 0.975 in one run
    and below 0.923 in another -- so two restarts were not enough to pass every time. Reliable convergence on every
    seed is issue 15's)."""
    from pyro_bbb.datasets import embedded_reber

    x, y = embedded_reber(5000, seed=0)
    validation = embedded_reber(1000, seed=1)
    best = {"deterministic": 0.0, "bayesian": 0.0}
    for seed in (0, 1, 2):
        for name, make in (("deterministic", lambda: nn.LSTM(7, 4, batch_first=True)),
                           ("bayesian", lambda: BayesianLSTM(7, 4, batch_first=True))):  # fmt: skip
            pyro.clear_param_store()
            torch.manual_seed(seed)
            bnn = pyro_bbb.BNN(LastStep(make(), 4), likelihoods.Bernoulli())
            guide = pyro_bbb.MeanFieldGuide(bnn)
            settings = {"epochs": 30, "batch_size": 32, "lr": 0.01, "clip_norm": 5.0, "estimator": "flipout"}
            history = pyro_bbb.fit(bnn, guide, (x, y), validation_data=validation, progress=False, seed=seed,
                                   **settings)  # fmt: skip
            best[name] = max(best[name], *history["val_accuracy"])
    assert best["bayesian"] >= 0.85
    assert best["bayesian"] >= best["deterministic"] - 0.03

"""Post-hoc temperature scaling: recovers a known temperature, keeps the predicted class, refuses the training data."""

import pyro
import pytest
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.evaluate.calibration import TemperatureScaling, fit_temperature
from pyro_bbb.nn import BayesianLinear


@pytest.mark.parametrize("true_temperature", [0.5, 2.0])
def test_the_fitted_temperature_is_the_one_the_labels_were_drawn_with(true_temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, 5, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(logits / true_temperature, -1), 1, generator=g).squeeze(-1)
    scaling = TemperatureScaling().fit(torch.softmax(logits, -1), y)
    assert scaling.temperature == pytest.approx(true_temperature, rel=0.05)
    calibrated = scaling(torch.softmax(logits, -1))
    assert torch.equal(calibrated.argmax(-1), logits.argmax(-1))
    torch.testing.assert_close(calibrated, torch.softmax(logits / scaling.temperature, -1))
    # the NLL at the fitted temperature is the lowest nearby
    def nll(t):
        return float(torch.nn.functional.cross_entropy(logits / t, y))

    assert nll(scaling.temperature) <= min(nll(scaling.temperature * 0.9), nll(scaling.temperature * 1.1))


def test_a_split_that_defines_no_temperature_is_said_so():
    """Validation rows all classified correctly (the NLL falls as T -> 0: L-BFGS stopped at T = 0.044, turning 0.73
    into 0.9999999998) or nearly all wrong (T -> the clamp, 1000): a warning, not a silent number; an ordinary split
    none."""
    import warnings

    p = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4], [0.1, 0.9], [0.55, 0.45]])
    with pytest.warns(UserWarning, match="the 5 validation rows are all classified correctly.*Hold out more rows"):
        TemperatureScaling().fit(p, torch.tensor([0, 1, 0, 1, 0]))
    with pytest.warns(UserWarning, match="classified so badly that the NLL falls as T grows"):
        TemperatureScaling().fit(p, torch.tensor([1, 0, 1, 0, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TemperatureScaling().fit(p, torch.tensor([0, 1, 1, 1, 0]))


def test_binary_probabilities_and_bad_input():
    p = torch.tensor([0.9, 0.8, 0.95, 0.1, 0.2])
    y = torch.tensor([1, 0, 1, 0, 1])
    calibrated = TemperatureScaling().fit(p, y)(p)
    assert calibrated.shape == (5, 2) and torch.equal(calibrated.argmax(-1), (p > 0.5).long())
    with pytest.raises(ValueError, match="at least two"):
        TemperatureScaling().fit(p[:1], y[:1])
    with pytest.raises(ValueError, match="temperature"):
        TemperatureScaling(0.0)
    with pytest.raises(TypeError, match="probability tensor"):
        TemperatureScaling().fit([0.5], y)


def test_fit_temperature_refuses_the_training_data_and_takes_a_held_out_split():
    pyro.clear_param_store()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(120, 4, generator=g), torch.randint(0, 3, (120,), generator=g)
    bnn = pyro_bbb.BNN(BayesianLinear(4, 3), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x[:90], y[:90]), epochs=3, batch_size=30, progress=False, seed=0)
    with pytest.raises(ValueError, match="trained on"):
        fit_temperature(bnn, guide, (x[:90], y[:90]))
    with pytest.raises(ValueError, match="trained on"):
        fit_temperature(bnn, guide, (x[10:40].clone(), y[10:40]))  # the same rows in another tensor
    for held in (x[:90].numpy(), x[:90].double()):  # or as numpy, or in float64 (fit cast its rows to float32)
        with pytest.raises(ValueError, match="trained on"):
            fit_temperature(bnn, guide, (held, y[:90]))
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    scaling = fit_temperature(bnn, guide, (x[80:], y[80:]))  # partly seen: a held-out split with some overlap
    assert 1e-3 < scaling.temperature < 1e3
    assert all(torch.equal(v, before[k]) for k, v in guide.state_dict().items())  # the posterior is untouched
    pyro.clear_param_store()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:90], y[:90]), batch_size=30, shuffle=True)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, loader, epochs=3, progress=False, seed=0)
    with pytest.raises(ValueError, match="trained on"):  # a DataLoader's rows, where they can be read, are known too
        fit_temperature(bnn, guide, (x[:90], y[:90]))
    pyro.clear_param_store()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x[:90].double().numpy(), y[:90]), epochs=3, batch_size=30, progress=False, seed=0)
    with pytest.raises(ValueError, match="trained on"):  # float64 numpy rows in fit, the same rows again here
        fit_temperature(bnn, guide, (x[:90].double().numpy(), y[:90]))
    pyro.clear_param_store()
    regression = pyro_bbb.BNN(BayesianLinear(4, 1), likelihoods.Gaussian())
    with pytest.raises(TypeError, match="classifier"):
        fit_temperature(regression, pyro_bbb.MeanFieldGuide(regression), (x, torch.randn(120)))


def test_fit_temperature_refuses_a_regression_and_unpaired_rows_before_any_draw():
    """Both were refused only after a full prediction, which had drawn from the caller's random stream."""
    pyro.clear_param_store()
    x = torch.randn(20, 4)
    regression = pyro_bbb.BNN(BayesianLinear(4, 1), likelihoods.Gaussian(scale=0.5))
    classifier = pyro_bbb.BNN(BayesianLinear(4, 3), likelihoods.Categorical())
    for model, y, error, refusal in [(regression, torch.randn(20), TypeError, "for a classifier.*Gaussian"),
                                     (classifier, torch.zeros(15, dtype=torch.long), ValueError,
                                      "20 rows but y has 15")]:
        pyro.clear_param_store()
        guide = pyro_bbb.MeanFieldGuide(model)
        guide(x, y[:0].new_zeros(20))
        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        with pytest.raises(error, match=refusal):
            fit_temperature(model, guide, (x, y))
        assert torch.equal(torch.rand(3), expected)

import math

import pyro.distributions as dist
import pytest
import torch

from pyro_bbb.evaluate import metrics
from pyro_bbb.prediction.results import ClassificationPrediction, Prediction, RegressionPrediction


def test_ece_by_hand():
    # bins of width 0.25: [0.5, 0.75) holds {0.6, 0.7} (1 of 2 right), [0.75, 1] holds {0.9, 0.95} (both right)
    probs = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.9, 0.1], [0.05, 0.95]])
    y = torch.tensor([0, 0, 0, 1])
    expected = 2 / 4 * abs(0.5 - 0.65) + 2 / 4 * abs(1.0 - 0.925)
    assert metrics.expected_calibration_error(probs, y, num_bins=4) == pytest.approx(expected)


def test_ece_is_zero_for_perfect_calibration_and_one_bin_is_the_accuracy_gap():
    probs = torch.tensor([[0.25, 0.75]] * 4)
    assert metrics.expected_calibration_error(probs, torch.tensor([1, 1, 1, 0])) == pytest.approx(0.0, abs=1e-7)
    y = torch.tensor([0, 0, 1, 1])
    assert metrics.expected_calibration_error(probs, y, num_bins=1) == pytest.approx(0.25)


def test_accuracy_brier_and_binary_inputs():
    probs = torch.tensor([0.9, 0.2, 0.6])  # P(y = 1)
    y = torch.tensor([1, 0, 0])
    assert metrics.accuracy(probs, y) == pytest.approx(2 / 3)
    expected = ((0.1**2) * 2 + (0.2**2) * 2 + (0.6**2) * 2) / 3
    assert metrics.brier_score(probs, y) == pytest.approx(expected)


def test_metrics_accept_predictions():
    logits = torch.randn(5, 8, 3)
    pred = ClassificationPrediction(dist.Categorical(logits=logits), torch.zeros(5, 8))
    y = torch.randint(0, 3, (8,))
    probs = logits.softmax(-1).mean(0)
    assert metrics.accuracy(pred, y) == metrics.accuracy(probs, y)
    assert metrics.brier_score(pred, y) == pytest.approx(metrics.brier_score(probs, y))


def test_log_likelihood_reductions():
    pred = Prediction(dist.Normal(torch.tensor([[0.0, 1.0], [2.0, 1.0]]), 1.0), torch.zeros(2, 2))
    y = torch.tensor([1.0, 1.0])
    per_datum = metrics.log_likelihood(pred, y, reduction="none")
    normal = dist.Normal(0.0, 1.0)
    expected = torch.stack([normal.log_prob(torch.tensor(1.0)), normal.log_prob(torch.tensor(0.0))])
    torch.testing.assert_close(per_datum, expected)
    assert metrics.log_likelihood(pred, y, reduction="sum") == pytest.approx(float(per_datum.sum()))
    with pytest.raises(ValueError, match="reduction"):
        metrics.log_likelihood(pred, y, reduction="max")


def test_rmse_and_coverage():
    loc = torch.zeros(1000, 1).expand(1000, 4000)
    pred = RegressionPrediction(dist.Normal(loc[:1].expand(1, 4000), 1.0), torch.zeros(1, 4000))
    y = torch.randn(4000, generator=torch.Generator().manual_seed(0))
    # 4000 standard-normal targets: coverage of the 90% interval within 3 binomial standard errors
    assert metrics.interval_coverage(pred, y, 0.9) == pytest.approx(0.9, abs=3 * math.sqrt(0.09 / 4000))
    assert metrics.rmse(pred, y) == pytest.approx(float(y.pow(2).mean().sqrt()))


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="covers 3 inputs"):
        metrics.accuracy(torch.rand(3, 2), torch.tensor([0, 1]))

import math

import numpy as np
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
        metrics.accuracy(torch.rand(3, 2).softmax(-1), torch.tensor([0, 1]))


# -- what the uncertainty buys: against scikit-learn ------------------------------------------------------------
def _scores(seed, n_in=300, n_out=200, ties=False):
    g = torch.Generator().manual_seed(seed)
    inside, outside = torch.rand(n_in, generator=g), torch.rand(n_out, generator=g) + 0.3
    if ties:  # few distinct values: many ties within and across the sets
        inside, outside = (inside * 8).round() / 8, (outside * 8).round() / 8
    return inside, outside


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detection_metrics_equal_scikit_learn(seed, ties):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    import numpy as np

    inside, outside = _scores(seed, ties=ties)
    labels = np.r_[np.zeros(len(inside)), np.ones(len(outside))]
    scores = np.r_[inside.numpy(), outside.numpy()].astype(np.float64)
    assert metrics.ood_auroc(inside, outside) == pytest.approx(sklearn_metrics.roc_auc_score(labels, scores), abs=1e-6)
    assert metrics.ood_aupr(inside, outside) == pytest.approx(
        sklearn_metrics.average_precision_score(labels, scores), abs=1e-6)
    fpr, tpr, _ = sklearn_metrics.roc_curve(labels, scores, drop_intermediate=False)
    for level in (0.5, 0.8, 0.95, 1.0):
        expected = fpr[np.searchsorted(tpr, level - 1e-12)]
        assert metrics.fpr_at_tpr(inside, outside, tpr=level) == pytest.approx(expected, abs=1e-6)


def test_detection_reads_the_score_a_prediction_carries():
    g = torch.Generator().manual_seed(0)
    sure = torch.softmax(torch.randn(4, 30, 3, generator=g) * 4 + torch.tensor([6.0, 0, 0]), -1)
    unsure = torch.softmax(torch.randn(4, 20, 3, generator=g), -1)
    inside = ClassificationPrediction(dist.Categorical(probs=sure), torch.zeros(4, 30))
    outside = ClassificationPrediction(dist.Categorical(probs=unsure), torch.zeros(4, 20))
    for score in ("entropy", "mutual_information", "max_probability"):
        expected = metrics.ood_auroc(metrics.uncertainty_score(inside, score),
                                     metrics.uncertainty_score(outside, score))
        assert metrics.ood_auroc(inside, outside, score=score) == expected
    assert metrics.ood_auroc(inside, outside) > 0.9  # entropy separates the sure from the unsure
    torch.testing.assert_close(metrics.uncertainty_score(inside, "max_probability"), 1 - inside.probs.max(-1).values)
    regression = RegressionPrediction(dist.Normal(torch.zeros(4, 5), torch.arange(1.0, 6.0)), torch.zeros(4, 5))
    torch.testing.assert_close(metrics.uncertainty_score(regression, "std"), regression.std)
    with pytest.raises(ValueError, match='score="std" is for a regression'):
        metrics.uncertainty_score(inside, "std")
    with pytest.raises(ValueError, match="is for a classifier"):
        metrics.uncertainty_score(regression, "entropy")
    with pytest.raises(ValueError, match="at least one"):
        metrics.ood_auroc(torch.zeros(0), torch.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        metrics.ood_auroc(torch.tensor([float("nan")]), torch.ones(3))


def test_risk_coverage_and_aurc_by_hand_and_against_a_sort():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(1, 200, 4, generator=g) * 2, -1)
    y = torch.randint(0, 4, (200,), generator=g)
    p = ClassificationPrediction(dist.Categorical(probs=probs), torch.zeros(1, 200))
    coverage, risk = metrics.risk_coverage(p, y)
    confidence = probs[0].max(-1).values
    errors = (probs[0].argmax(-1) != y).double()[torch.argsort(-confidence, stable=True)]
    for k in (1, 50, 160, 200):
        assert coverage[k - 1] == k / 200 and risk[k - 1] == pytest.approx(float(errors[:k].mean()), abs=1e-12)
    assert risk[-1] == pytest.approx(1 - metrics.accuracy(p, y), abs=1e-6)
    assert metrics.aurc(p, y) == pytest.approx(float(risk.mean()), abs=1e-12)
    assert metrics.risk_at_coverage(p, y, 0.8) == pytest.approx(float(errors[:160].mean()), abs=1e-12)
    for fraction in (0.29, 0.58, 0.57, 0.07):  # fractions whose product with 200 is a hair under a whole number
        k = round(fraction * 200)
        assert metrics.risk_at_coverage(p, y, fraction) == pytest.approx(float(errors[:k].mean()), abs=1e-12)
    regression = RegressionPrediction(dist.Normal(torch.zeros(2, 3), torch.tensor([1.0, 3.0, 2.0])),
                                      torch.zeros(2, 3))
    _, mse = metrics.risk_coverage(regression, torch.tensor([1.0, 3.0, 2.0]), score="std")
    assert mse.tolist() == [1.0, 2.5, 14 / 3]  # kept by width 1, 2, 3: errors 1, 4, 9
    with pytest.raises(ValueError, match="coverage"):
        metrics.risk_at_coverage(p, y, 0.0)


def test_adaptive_and_classwise_calibration_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    y = torch.tensor([0, 1, 0, 1])
    # equal mass, 2 bins: {0.6 right, 0.7 right} gap |2 - 1.3| ; {0.8 wrong, 0.9 right} gap |1 - 1.7|
    assert metrics.adaptive_calibration_error(probs, y, num_bins=2) == pytest.approx((0.7 + 0.7) / 4)
    # one bin per input: the mean of |correct - confidence|
    assert metrics.adaptive_calibration_error(probs, y, num_bins=4) == pytest.approx((0.1 + 0.8 + 0.4 + 0.3) / 4)
    # one class-wise bin: |mean p_c - freq(c)| averaged over classes
    assert metrics.classwise_calibration_error(probs, y, num_bins=1) == pytest.approx(abs(0.65 - 0.5))
    # binary probabilities of class 1 are the two-column case
    assert metrics.classwise_calibration_error(probs[:, 1], y) == pytest.approx(
        metrics.classwise_calibration_error(probs, y))


@pytest.mark.parametrize("labels", ["long", "int32", "float", "bool"])
@pytest.mark.parametrize("shape", ["(N,)", "(N, 1)"])
def test_a_bernoulli_prediction_takes_the_labels_fit_takes_and_equals_the_hand_computed_value(labels, shape):
    """Integer, float or boolean 0/1 labels, (N,) or (N, 1): the log predictive density of a two-draw Bernoulli."""
    probs = torch.tensor([[0.9, 0.2, 0.6], [0.7, 0.4, 0.6]])  # 2 draws x 3 inputs, P(y = 1)
    prediction = ClassificationPrediction(dist.Bernoulli(probs=probs), torch.zeros(2, 3))
    y = torch.tensor([1, 0, 1])
    y = {"long": y, "int32": y.int(), "float": y.float(), "bool": y.bool()}[labels]
    y = y if shape == "(N,)" else y[:, None]
    expected = [math.log((0.9 + 0.7) / 2), math.log((0.8 + 0.6) / 2), math.log(0.6)]
    torch.testing.assert_close(metrics.log_likelihood(prediction, y, reduction="none"),
                               torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert metrics.accuracy(prediction, y) == pytest.approx(1.0)


# Every metric takes what predict returns and the labels fit takes, or says what to pass instead.

_THREE_CLASS_DRAWS = torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]],   # draw 1: 2 inputs x 3 classes
                                   [[0.5, 0.4, 0.1], [0.3, 0.3, 0.4]]])  # draw 2


def _labels(kind, values, num_classes):
    y = torch.tensor(values)
    return {"long": y, "int32": y.int(), "float": y.float(), "bool": y.bool(),
            "long (N, 1)": y[:, None], "float (N, 1)": y.float()[:, None],
            "one-hot": torch.nn.functional.one_hot(y, num_classes),
            "one-hot float": torch.nn.functional.one_hot(y, num_classes).float(),
            "one-hot bool": torch.nn.functional.one_hot(y, num_classes).bool()}[kind]


@pytest.mark.parametrize("kind", ["long", "int32", "float", "long (N, 1)", "float (N, 1)", "one-hot", "one-hot float",
                                  "one-hot bool"])  # (booleans one-hot were refused as "not one-hot")
def test_a_categorical_prediction_takes_every_label_form_with_hand_computed_values(kind):
    prediction = ClassificationPrediction(dist.Categorical(probs=_THREE_CLASS_DRAWS), torch.zeros(2, 2))
    y = _labels(kind, [0, 2], 3)
    # predictive probabilities: [0.6, 0.3, 0.1] and [0.2, 0.3, 0.5]; labels 0 and 2
    assert metrics.log_likelihood(prediction, y) == pytest.approx((math.log(0.6) + math.log(0.5)) / 2, rel=1e-6)
    assert metrics.log_likelihood(prediction.probs, y) == pytest.approx((math.log(0.6) + math.log(0.5)) / 2,
                                                                       rel=1e-6)
    assert metrics.accuracy(prediction, y) == 1.0
    brier = ((0.4 ** 2 + 0.3 ** 2 + 0.1 ** 2) + (0.2 ** 2 + 0.3 ** 2 + 0.5 ** 2)) / 2
    assert metrics.brier_score(prediction, y) == pytest.approx(brier, rel=1e-6)
    assert metrics.expected_calibration_error(prediction, y) == pytest.approx(((1 - 0.6) + (1 - 0.5)) / 2, rel=1e-5)
    reference = torch.tensor([0, 2])
    for metric in (metrics.adaptive_calibration_error, metrics.classwise_calibration_error, metrics.aurc):
        assert metric(prediction, y) == pytest.approx(metric(prediction, reference))


@pytest.mark.parametrize("kind", ["long", "int32", "float", "bool", "long (N, 1)", "float (N, 1)", "one-hot"])
def test_a_bernoulli_prediction_takes_every_label_form_with_hand_computed_values(kind):
    probs = torch.tensor([[0.9, 0.2], [0.7, 0.4]])   # 2 draws x 2 inputs, P(y = 1): predictive 0.8 and 0.3
    prediction = ClassificationPrediction(dist.Bernoulli(probs=probs), torch.zeros(2, 2))
    y = _labels(kind, [1, 0], 2)
    expected = (math.log(0.8) + math.log(0.7)) / 2
    assert metrics.log_likelihood(prediction, y) == pytest.approx(expected, rel=1e-6)
    assert metrics.log_likelihood(prediction.probs, y) == pytest.approx(expected, rel=1e-6)
    assert metrics.accuracy(prediction, y) == 1.0
    assert metrics.brier_score(prediction, y) == pytest.approx(((0.2 ** 2) * 2 + (0.3 ** 2) * 2) / 2, rel=1e-6)
    assert metrics.expected_calibration_error(prediction, y) == pytest.approx((0.2 + 0.3) / 2, rel=1e-5)


@pytest.mark.parametrize("shape", ["(N,)", "(N, 1)"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_regression_prediction_takes_targets_as_fit_does_with_hand_computed_values(shape, dtype):
    loc = torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=dtype)   # 2 draws x 2 inputs, unit noise
    prediction = RegressionPrediction(dist.Normal(loc, 1.0), loc)
    y = torch.tensor([1.0, 1.0], dtype=dtype)
    y = y if shape == "(N,)" else y[:, None]
    expected = (math.log(math.exp(-0.5) / math.sqrt(2 * math.pi)) + math.log(1 / math.sqrt(2 * math.pi))) / 2
    assert metrics.log_likelihood(prediction, y) == pytest.approx(expected, rel=1e-6)
    assert metrics.rmse(prediction, y) == pytest.approx(0.0, abs=1e-7)
    assert metrics.interval_coverage(prediction, y) == 1.0


def test_labels_that_are_not_labels_get_an_error_naming_the_fix():
    prediction = ClassificationPrediction(dist.Categorical(probs=_THREE_CLASS_DRAWS), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"not one-hot.*y.argmax\(-1\)"):
        metrics.log_likelihood(prediction, torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]]))   # probabilities
    with pytest.raises(ValueError, match="fractional"):
        metrics.accuracy(prediction, torch.tensor([0.5, 2.0]))
    with pytest.raises(ValueError, match=r"0\.\.2 for 3 classes, but y holds 3"):
        metrics.brier_score(prediction, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="needs targets of shape"):
        metrics.expected_calibration_error(prediction, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="a mean alone has no density"):
        metrics.log_likelihood(torch.tensor([2.5, -1.0]), torch.tensor([2.0, -1.0]))
    with pytest.raises(TypeError, match="Prediction from pyro_bbb.predict"):
        metrics.log_likelihood([0.5, 0.5], torch.tensor([0, 1]))


@pytest.mark.parametrize("likelihood", ["Gaussian", "HeteroscedasticGaussian", "Categorical", "Bernoulli"])
def test_every_metric_takes_what_predict_returns(likelihood):
    """A real BNN's predict output under each likelihood, through every metric that applies to it."""
    import pyro_bbb
    from pyro_bbb import likelihoods
    from pyro_bbb.nn import BayesianLinear

    torch.manual_seed(0)
    outputs = {"Gaussian": 1, "HeteroscedasticGaussian": 2, "Categorical": 3, "Bernoulli": 1}[likelihood]
    bnn = pyro_bbb.BNN(BayesianLinear(4, outputs), getattr(likelihoods, likelihood)())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x = torch.randn(12, 4)
    y = {"Categorical": torch.randint(0, 3, (12,)), "Bernoulli": torch.randint(0, 2, (12, 1))}.get(
        likelihood, torch.randn(12, 1))
    guide(x, y)
    prediction = pyro_bbb.predict(bnn, guide, x, num_samples=20)
    shifted = pyro_bbb.predict(bnn, guide, 5 * x, num_samples=20)
    values = [metrics.log_likelihood(prediction, y), metrics.aurc(prediction, y),
              metrics.risk_at_coverage(prediction, y, 0.5)]
    values += [metric(prediction, shifted) for metric in (metrics.ood_auroc, metrics.ood_aupr, metrics.fpr_at_tpr)]
    score = "std" if isinstance(prediction, RegressionPrediction) else "entropy"   # each one's own, unnamed
    assert values[3] == metrics.ood_auroc(prediction, shifted, score=score)
    if isinstance(prediction, ClassificationPrediction):
        values += [metric(prediction, y) for metric in (
            metrics.accuracy, metrics.expected_calibration_error, metrics.brier_score,
            metrics.adaptive_calibration_error, metrics.classwise_calibration_error)]
        values.append(metrics.log_likelihood(prediction.probs, y))
        assert values[-1] == pytest.approx(values[0], rel=1e-5)   # the probabilities' log at the label: the same
        for regression_metric in (metrics.rmse, metrics.interval_coverage):
            with pytest.raises(TypeError, match="is a regression metric and this is a classifier's prediction"):
                regression_metric(prediction, y)
    else:
        values += [metrics.rmse(prediction, y), metrics.interval_coverage(prediction, y)]
    assert all(math.isfinite(v) for v in values)


def test_a_sigmoid_column_is_read_as_the_binary_probabilities_it_is():
    """``net(x).sigmoid()`` of a one-output net is ``(N, 1)``: every metric refused it as rows not summing to 1 and
    told the user to pass ``logits.sigmoid()``, which they had. It is P(y = 1), as the same values ``(N,)`` are."""
    from pyro_bbb.evaluate.calibration import TemperatureScaling

    g = torch.Generator().manual_seed(0)
    column = torch.rand(40, 1, generator=g)
    y = torch.randint(0, 2, (40,), generator=g)
    two_columns = torch.cat([1 - column, column], -1)
    for metric in (metrics.brier_score, metrics.expected_calibration_error, metrics.adaptive_calibration_error,
                   metrics.classwise_calibration_error, metrics.accuracy, metrics.log_likelihood):
        assert metric(column, y) == pytest.approx(metric(two_columns, y), rel=1e-6)
    assert metrics.log_likelihood(column, y) == pytest.approx(
        torch.where(y == 1, column[:, 0], 1 - column[:, 0]).log().mean().item(), rel=1e-6)  # by hand
    assert TemperatureScaling().fit(column, y).temperature == pytest.approx(
        TemperatureScaling().fit(two_columns, y).temperature, rel=1e-6)
    with pytest.raises(ValueError, match="binary: logits.sigmoid"):
        metrics.accuracy(column * 4 - 2, y)  # a logit column is still refused


def test_logits_are_refused_by_every_metric_that_reads_probabilities():
    """Brier 24 (its maximum is 2), ECE 8.5 (at most 1), binary logits read as P(y = 1), a temperature of 218: all
    silent before; each now names itself and the fix."""
    from pyro_bbb.evaluate.calibration import TemperatureScaling

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 3, generator=g) * 3
    y = torch.randint(0, 3, (50,), generator=g)
    for metric in (metrics.brier_score, metrics.expected_calibration_error, metrics.adaptive_calibration_error,
                   metrics.classwise_calibration_error, metrics.accuracy, metrics.log_likelihood):
        with pytest.raises(ValueError, match=f"{metric.__name__} reads a plain tensor.*logits.softmax"):
            metric(logits, y)
        metric(logits.softmax(-1), y)  # probabilities are read as before
    with pytest.raises(ValueError, match="binary: logits.sigmoid"):
        metrics.accuracy(torch.randn(50, generator=g), y.clamp(max=1))
    with pytest.raises(ValueError, match="TemperatureScaling reads a plain tensor"):
        TemperatureScaling().fit(logits.log_softmax(-1), y)


def test_a_tensor_of_scores_is_one_per_input():
    probs = torch.rand(20, 3).softmax(-1)
    with pytest.raises(ValueError, match=r"one uncertainty score per input.*\(20, 3\).*predictive_entropy"):
        metrics.ood_auroc(probs, probs)
    scores = torch.rand(20)
    assert metrics.ood_auroc(scores[:, None], scores[:, None] + 1) == metrics.ood_auroc(scores, scores + 1) == 1.0


def test_half_precision_probabilities_are_read_as_probabilities():
    logits = torch.randn(50, 10, generator=torch.Generator().manual_seed(1)) * 3
    y = torch.randint(0, 10, (50,))
    for dtype in (torch.float16, torch.bfloat16):
        metrics.expected_calibration_error(logits.softmax(-1).to(dtype), y)


def test_pyros_predictive_output_gets_a_clear_error_naming_pyro_bbb_predict():
    """pyro.infer.Predictive returns a dict of sample sites: every metric names the fix instead of an
    AttributeError, a str's missing shape, or a complaint about a score nobody passed; (draws, inputs) samples given
    to rmse as means name their mean."""
    samples = {"obs": torch.randn(5, 3)}
    y = torch.zeros(3)
    for metric, args in [(metrics.rmse, (samples, y)), (metrics.interval_coverage, (samples, y)),
                         (metrics.aurc, (samples, y)), (metrics.risk_coverage, (samples, y)),
                         (metrics.ood_auroc, (samples, samples)), (metrics.ood_aupr, (samples, samples)),
                         (metrics.log_likelihood, (samples, y)), (metrics.accuracy, (samples, y))]:
        with pytest.raises(TypeError, match=r"got a dict .*pyro\.infer\.Predictive.*pyro_bbb\.predict\(model, guide"):
            metric(*args)
    with pytest.raises(ValueError, match=r"shape \(5, 3\) for 3 targets.*samples\.mean\(0\)"):
        metrics.rmse(samples["obs"], y)
    assert metrics.rmse(samples["obs"].mean(0), y) == pytest.approx(float(samples["obs"].mean(0).pow(2).mean().sqrt()))


def test_regression_metrics_name_targets_and_pairs_they_cannot_read():
    """Targets given as a list, and a pair that is not two tensors, get the error that names them (not torch's
    "too many dimensions 'str'" from reading the targets for a hint first)."""
    mean = torch.zeros(3)
    for y in (["a", "b", "c"], [0.0, 1.0, 2.0]):
        with pytest.raises(TypeError, match="y must be a torch.Tensor or a numpy array, got list"):
            metrics.rmse(mean, y)
    assert metrics.rmse(mean, np.ones(3)) == pytest.approx(1.0)
    for pair in ((mean,), (mean, mean, mean), (mean, 1.0), "ab", [mean, mean.numpy()]):
        with pytest.raises(TypeError, match=r"interval_coverage takes .* a \(lower, upper\) pair of tensors"):
            metrics.interval_coverage(pair, mean)
    assert metrics.interval_coverage([mean - 1, mean + 1], torch.tensor([0.5, 2.0, -0.5])) == pytest.approx(2 / 3)


def test_every_metric_computes_on_the_device_of_its_inputs():
    """Nothing is made on torch's default device: under another default (here "meta", standing in for CUDA data
    with a CPU default or the reverse), each metric gives its number on CPU inputs (expected_calibration_error's
    bins were made on the default device: a device mismatch on CUDA predictions)."""
    import inspect

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(40, 3, generator=g), -1)
    inputs = [(probs, torch.randint(0, 3, (40,), generator=g)), (torch.randn(40, generator=g), torch.randn(40)),
              (probs[:, 0], probs[:, 1])]
    checked = []
    for name, metric in inspect.getmembers(metrics, inspect.isfunction):
        if name.startswith("_") or metric.__module__ != metrics.__name__:
            continue
        for args in inputs:
            try:
                expected = metric(*args)
            except (TypeError, ValueError):  # (not this metric's kind of input)
                continue
            with torch.device("meta"):
                assert str(metric(*args)) == str(expected), name
            checked.append(name)
            break
    assert {"expected_calibration_error", "adaptive_calibration_error", "rmse", "ood_auroc"} <= set(checked)

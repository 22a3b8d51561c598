"""Prediction: the posterior predictive of a trained model (:mod:`~pyro_bbb.prediction.predictive`), the results it
returns (:mod:`~pyro_bbb.prediction.results`) and the effect handlers of a prediction pass
(:mod:`~pyro_bbb.prediction.messengers`).

Examples
--------
>>> bnn = BNN(BayesianLinear(2, 3), likelihoods.Categorical())
>>> guide = MeanFieldGuide(bnn)
>>> pyro_bbb.prediction.set_up_guide(bnn, guide, torch.randn(4, 2))
>>> pyro_bbb.prediction.predict(bnn, guide, torch.randn(5, 2), num_samples=4).probs.shape
torch.Size([5, 3])
"""

from .predictive import UntrainedGuideWarning, predict, set_up_guide
from .results import ClassificationPrediction, Prediction, RegressionPrediction

__all__ = [
    "predict", "set_up_guide", "UntrainedGuideWarning", "Prediction", "RegressionPrediction",
    "ClassificationPrediction",
]

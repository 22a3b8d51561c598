"""pyro_bbb: Bayes-by-Backprop Bayesian neural networks in Pyro, correct by construction.

The three-line happy path (``model -> guide -> fit -> predict``):

Examples
--------
>>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
>>> bnn = pyro_bbb.BNN(BayesianLinear(4, 3), likelihood=likelihoods.Categorical())
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=16, progress=False)
>>> pyro_bbb.predict(bnn, guide, x[:5], num_samples=10).probs.shape
torch.Size([5, 3])
"""

__version__ = "0.1.0"

from . import (  # noqa: E402,E501
    checks,
    datasets,
    diagnostics,
    handlers,
    inputs,
    likelihoods,
    metrics,
    moments,
    nn,
    optim,
    plots,
    predictive,
    priors,
    pruning,
    pyro_adapter,
    schedules,
    stopping,
)
from .bnn import BNN  # noqa: E402
from .checkpoint import load, save  # noqa: E402
from .convert import bayesianize  # noqa: E402
from .diagnostics import summary  # noqa: E402
from .elbo import ELBO, DataPlateScaleMessenger  # noqa: E402
from .export import to_inference_data  # noqa: E402
from .guide import DEFAULT_INIT_SCALE, MeanFieldGuide  # noqa: E402
from .handlers import (  # noqa: E402
    FlipoutMessenger,
    LocalReparameterizationMessenger,
    MomentPropagationMessenger,
    flipout,
    local_reparameterization,
    moment_propagation,
)
from .prediction import ClassificationPrediction, Prediction, RegressionPrediction  # noqa: E402
from .predictive import predict, set_up_guide  # noqa: E402
from .stopping import EarlyStopping  # noqa: E402
from .training import DataError, History, TrainingDivergedError, fit  # noqa: E402

__all__ = [
    "BNN",
    "bayesianize",
    "ELBO",
    "DataPlateScaleMessenger",
    "MeanFieldGuide",
    "DEFAULT_INIT_SCALE",
    "flipout",
    "local_reparameterization",
    "FlipoutMessenger",
    "LocalReparameterizationMessenger",
    "moment_propagation",
    "MomentPropagationMessenger",
    "fit",
    "EarlyStopping",
    "History",
    "TrainingDivergedError",
    "DataError",
    "set_up_guide",
    "predict",
    "Prediction",
    "RegressionPrediction",
    "ClassificationPrediction",
    "save",
    "summary",
    "to_inference_data",
    "load",
    "datasets",
    "diagnostics",
    "handlers",
    "inputs",
    "likelihoods",
    "metrics",
    "moments",
    "nn",
    "optim",
    "plots",
    "predictive",
    "checks",
    "pruning",
    "pyro_adapter",
    "priors",
    "schedules",
    "stopping",
    "__version__",
]

"""Training: ``fit`` (:mod:`~pyro_bbb.train.loop`), the KL weight's choice (:mod:`~pyro_bbb.train.selection`) after a
MAP warm start (:mod:`~pyro_bbb.train.warm_start`), its
:class:`History` (:mod:`~pyro_bbb.train.history`), one
training step and its checks (:mod:`~pyro_bbb.train.step`), early stopping (:mod:`~pyro_bbb.train.stopping`),
data-parallel training (:mod:`~pyro_bbb.train.distributed`) and the Lightning module
(:mod:`~pyro_bbb.train.lightning`, imported on its own: it needs ``lightning``).

Examples
--------
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian())
>>> history = pyro_bbb.train.fit(bnn, MeanFieldGuide(bnn), (torch.randn(20, 3), torch.randn(20)), epochs=2,
...                              progress=False)
>>> len(history)
2
"""

from .history import History
from .loop import fit
from .selection import SelectKLWeight
from .step import TrainingDivergedError, TrainingStep
from .stopping import EarlyStopping

__all__ = ["fit", "History", "EarlyStopping", "TrainingDivergedError", "TrainingStep", "SelectKLWeight"]

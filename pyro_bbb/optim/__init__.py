"""Optimizers for SVI over a Bayesian network: :class:`Adam` (Pyro's Adam in one torch optimizer) and :class:`IVON`
(natural-gradient variational learning, which sets each weight's posterior width from the loss's curvature).

Examples
--------
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
>>> guide = MeanFieldGuide(bnn)
>>> svi = pyro.infer.SVI(bnn, guide, pyro_bbb.optim.IVON(guide, num_data=20), pyro_bbb.ELBO(num_data=20))
>>> loss = svi.step(torch.randn(20, 3), torch.randn(20))
"""

from .adam import Adam
from .ivon import IVON

__all__ = ["Adam", "IVON"]

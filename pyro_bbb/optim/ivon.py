"""``IVON``: natural-gradient variational learning of mean-field Gaussian posteriors (Shen et al., ICML 2024).

Adam treats a weight's posterior mean and width as two unrelated parameters and rescales each by its own gradient
history. IVON keeps, per weight, a running estimate ``h`` of the expected curvature of the loss per datum and *sets*
the width from it, ``sigma = 1 / sqrt(N (h + delta))``, where ``N`` is the training-set size and ``delta = 1 / (N
t^2)`` the per-datum precision of the weight's ``Normal(m, t)`` prior. The curvature is read off the ELBO's gradient
with respect to the width (Price's theorem: ``d E[loss] / d sigma = sigma E[loss'']``), so it works with every
estimator: reparameterization, Flipout, local reparameterization, and moment propagation, where that gradient is
exact. Per weight, with ``g`` the per-datum gradient of the expected negative log-likelihood::

    hhat     = (d E[nll] / d sigma) / (N sigma)                   Price's estimate of E[nll'']
    momentum <- beta1 momentum + (1 - beta1) g
    h        <- beta2 h + (1 - beta2) hhat + (1 - beta2)^2 / 2 (h - hhat)^2 / (h + delta)
    m        <- m - lr (hess_init + delta) clip((momentum / (1 - beta1^k) + delta (m - m_prior)) / (h + delta))
    sigma    <- 1 / sqrt(N (h + delta))

(``clip`` bounds each element by ``clip_radius``; ``1 - beta2`` scales with a scheduled learning rate.)

At a fixed point ``h`` is the expected curvature and ``m`` the stationary point of the expected loss plus the prior:
for a Gaussian likelihood with fixed noise that is exactly the optimal mean-field Gaussian of Bayesian linear
regression. The update equals ``ivon-opt`` 0.1.3's (``ivon.IVON``) given the same draws (``tests/optim/test_ivon.py``).

Examples
--------
>>> x, y = torch.randn(64, 2), torch.randn(64)
>>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=1.0))
>>> guide = MeanFieldGuide(bnn)
>>> history = pyro_bbb.fit(bnn, guide, (x, y), epochs=3, optimizer=IVON(guide, num_data=64), progress=False)
>>> guide.site_posteriors()["net.weight"].scale.shape
torch.Size([1, 2])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions.transforms import SoftplusTransform
from pyro.infer.inspect import get_dependencies
from pyro.optim import PyroOptim
from torch.distributions import transform_to

from .._checks import check_count, check_nonnegative, check_positive, is_number
from .._internals import tensor_version, unwrap_handlers
from .._plates import data_plate_of
from .._rng import rng_untouched
from ..distributions import EmpiricalBayesNormalDistribution
from ..infer.contract import ObjectiveRun, gradients_summed, take_objective_run
from ..infer.guide import has_site_posteriors, site_param_names
from ..infer.schedules import Constant
from ..nn.module import current_priors
from ..priors import is_real_support, strip_independent
from .adam import Adam

__all__ = ["IVON"]


class IVON(PyroOptim):
    """Natural-gradient variational learning for the weights of a mean-field guide; Adam for everything else.

    The weights are the guide's real-valued latent sites under a Normal prior (fixed, :class:`~pyro_bbb.priors.
    FanInNormal`, :class:`~pyro_bbb.priors.LearnedNormal` or :class:`~pyro_bbb.priors.EmpiricalBayesNormal`, whose
    precision is read every step). Their posterior means are stepped by IVON and their widths set from its curvature
    estimate; the other parameters a step passes (deterministic layers, a learned noise scale's posterior, a learned
    prior scale) get :class:`~pyro_bbb.optim.Adam` with ``adam_lr``. The first step sets every weight's width from
    ``hess_init`` (whatever the guide's ``init_scale``) and moves no mean: the widths are this optimizer's to choose
    (``keep_widths=True`` instead starts the curvature from the widths the guide has, to continue a trained guide).

    Parameters
    ----------
    guide : MeanFieldGuide or AutoNormal
        The guide whose weights it trains (its model's priors give each weight's precision).
    num_data : int
        ``N``, the size of the training set: the effective sample size of the posterior (as ``ELBO(num_data=N)``).
    lr : float
        Step size of the means, in units of ``1 / (hess_init + delta)`` (so ``lr`` is the first step's size).
    beta1 : float
        Momentum of the gradient.
    beta2 : float
        Memory of the curvature estimate: it averages over about ``1 / (1 - beta2)`` steps, so it must be well below
        1 for the width to converge within a run (``ivon-opt``'s 0.99999 is set for runs of a million steps).
    hess_init : float
        Initial curvature ``h`` per datum: the first width is ``1 / sqrt(N (hess_init + delta))``.
    clip_radius : float
        Clip each element of the mean's preconditioned step ``(momentum + delta m) / (h + delta)`` to ``[-clip_radius,
        clip_radius]``: a weight whose curvature estimate is near zero would otherwise take a Newton step of the order
        of ``N``. ``ivon-opt``'s default is no clipping (``math.inf``); ``benchmarks/README.md`` shows the choice.
    adam_lr : float
        Learning rate of the Adam that trains the other parameters.
    ess : float, optional
        The effective sample size of the posterior, ``N / kl_weight`` (default ``N``: the Bayes posterior, KL weight
        1). A tempered posterior, trained by ``pyro_bbb.ELBO(num_data=N, kl_weight=w)``, is the Bayes posterior of
        ``N / w`` data: pass ``ess=N / w`` (the widths and the prior's pull follow ``ess``; the gradients are still
        read per datum of the ``N``). Any other pairing of the objective's KL weight and ``ess`` is refused.
    keep_widths : bool
        Start each weight's curvature from the guide's width at the first step, ``h = 1 / (N sigma^2) - delta``
        (at least 0: a width beyond the prior's becomes the prior's), instead of from ``hess_init``: to continue from a
        trained guide (one trained with Adam, or restored without this optimizer's state). ``hess_init`` still sets
        the unit of ``lr``.

    Notes
    -----
    It reads the negative log-likelihood's gradients from the ELBO's by removing the closed-form KL's, so the KL
    must enter with the weight ``num_data / ess`` (1 by default; no KL schedule). With ``ess`` other than ``N``, read
    ``N`` as ``ess`` in the width and prior formulas above. Gradients averaged over ranks
    (``fit(distributed=True)``) average the curvature estimate with them. :meth:`get_state` keys the state by site name.

    The curvature estimate is Price's, read off one weight draw per step: under plain reparameterization it is
    heavy-tailed while the means are far from their optimum (the gradient over a small width), and one large estimate
    raises ``h`` -- and so slows that weight's mean -- for about ``1 / (1 - beta2)`` steps. Flipout and local
    reparameterization average it over the batch's independent perturbations: train with
    ``fit(..., estimator="local_reparam")`` (or ``"flipout"``, or ``"moments"``: exact) where the layers allow it.
    ``benchmarks/README.md`` has the measurements.

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    >>> guide = MeanFieldGuide(bnn)
    >>> IVON(guide, num_data=100, lr=0.1)
    IVON(num_data=100, lr=0.1, beta1=0.9, beta2=0.99, hess_init=1.0, clip_radius=0.1, adam_lr=0.001, keep_widths=False)
    """

    def __init__(
        self,
        guide: Any,
        num_data: int,
        lr: float = 0.1,
        beta1: float = 0.9,
        beta2: float = 0.99,
        hess_init: float = 1.0,
        clip_radius: float = 0.1,
        adam_lr: float = 1e-3,
        keep_widths: bool = False,
        ess: float | None = None,
    ):
        if not has_site_posteriors(guide):  # (AutoDiagonalNormal's one joint latent would all go to its Adam)
            raise TypeError(
                f"IVON trains the weights of a mean-field guide with a Normal posterior per site "
                f"(pyro_bbb.MeanFieldGuide or Pyro's AutoNormal), got {type(guide).__name__}: use one of those, or "
                "train this guide with pyro_bbb.optim.Adam."
            )
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= check_nonnegative(name, value) < 1.0:
                raise ValueError(f"`{name}` must lie in [0, 1), got {value!r}.")
        self.guide = guide
        self.num_data = check_count("num_data", num_data)
        self.ess = float(num_data) if ess is None else check_positive("ess", ess)
        self.defaults = {
            "lr": check_positive("lr", lr),
            "beta1": float(beta1),
            "beta2": float(beta2),
            "hess_init": check_positive("hess_init", hess_init),
            "clip_radius": math.inf if clip_radius == math.inf else check_positive("clip_radius", clip_radius),
            "adam_lr": check_positive("adam_lr", adam_lr),
            "keep_widths": bool(keep_widths),
        }
        super().__init__(torch.optim.Adam, {"lr": adam_lr})
        self.adam = Adam(lr=adam_lr)
        self.steps = 0  # IVON steps taken (the momentum's debiasing counts them)
        self._rate_ratio = 1.0  # the scheduled learning rate over the initial one: the curvature's step scales with it
        self.site_state: dict[str, dict[str, torch.Tensor]] = {}  # site -> momentum, hess (flattened)
        # unconstrained param (by identity) -> (site, "loc" | "scale" | "other")
        self._roles: dict[torch.Tensor, tuple[str, str]] = {}
        self._transform = transform_to(guide.scale_constraint)
        self._prior_cache: tuple | None = None  # (key, prior objects, flat (m, delta)) of fixed priors
        self._model_call: tuple | None = None  # (model, args, kwargs) of the latest objective run
        self._fixed_checked: set[str] = set()  # the sites whose prototype prior was found fixed (no latent upstream)
        self._flat: tuple | None = None  # (sites, momentum, hess) concatenated, between steps
        self._width_cache: tuple | None = None  # (sites, [(raw scale, version)], sigma, 1 / (N sigma d sigma / d u))
        self._unit: tuple | None = None  # (delta, hess_init + delta) of the last step
        self._loss_scale = 1.0  # the factor a handler multiplied this step's loss by (poutine.scale): divided out

    # -- which parameter is what ---------------------------------------------------------------------------------
    def _weight_sites(self) -> dict[str, tuple[str, str]]:
        """Site -> (loc name, scale name) in Pyro's param store, for every real latent site the guide has."""
        prototype = self.guide.prototype_trace
        if prototype is None:
            return {}
        return {name: site_param_names(self.guide, name) for name, site in prototype.iter_stochastic_nodes()
                if is_real_support(site["fn"].support)}

    def _classify(self, params: list[torch.Tensor]) -> None:
        """The role of every parameter not seen before (the guide's names are read only when there is one): by its
        name in Pyro's param store, or -- under ``pyro.settings.set(module_local_params=True)``, where the guide
        holds its parameters itself -- by its name in the guide (``locs.<site>_unconstrained``)."""
        new = [p for p in params if p not in self._roles]
        if not new:
            return
        store = pyro.get_param_store()
        by_name = {}
        for site, (loc, scale) in self._weight_sites().items():
            by_name[loc], by_name[scale] = (site, "loc"), (site, "scale")
        own = ({id(p): name.removesuffix("_unconstrained") for name, p in self.guide.named_parameters()}
               if isinstance(self.guide, torch.nn.Module) else {})
        for p in new:
            role = by_name.get(store.param_name(p))
            if role is None and id(p) in own:  # (a module-local parameter: its store name ends with its own)
                role = next((r for name, r in by_name.items() if name.endswith("." + own[id(p)])), None)
            self._roles[p] = role or ("", "other")
        if by_name and not any(role != "other" for _, role in self._roles.values()):
            for p in new:  # (asked again at the next step)
                del self._roles[p]
            raise ValueError(
                "IVON found none of the guide's weight sites among the parameters it was given (by their names in "
                "Pyro's param store or in the guide), so it would train every one as a point estimate with Adam, "
                "the widths left where they started. Give IVON the guide whose parameters the objective trains "
                "(IVON(guide, num_data=N))."
            )

    def _prior_vectors(self, sites: list[str], locs: list[torch.Tensor], sigmas: list[torch.Tensor]):
        """Flat ``(m, delta = 1 / (N t^2))`` of the sites' Normal priors as they are now, and whether they may differ
        from the last step's; fixed priors are read once (again after an in-place change), an empirical-Bayes prior
        every step (its scale follows the posterior)."""
        priors = current_priors(unwrap_handlers(self.guide.model))  # the user's model (an autoguide wraps it)
        prototype = self.guide.prototype_trace
        bases, key, dynamic = [], [], False
        for site, loc, sigma in zip(sites, locs, sigmas):
            base = strip_independent(priors.get(site, prototype.nodes[site]["fn"]))
            if site not in priors and _is_learned(base):
                model = unwrap_handlers(self.guide.model)
                if isinstance(model, torch.nn.Module):  # the module is the guide's: a prior of the model's own
                    raise ValueError(
                        f"IVON reads a learned prior as it is now only from pyro_bbb's layers (priors.LearnedNormal, "
                        f"EmpiricalBayesNormal), and the prior of weight site {site!r} is learned by the model itself "
                        "(a PyroSample or pyro.sample whose scale is a parameter): the prior of the guide's first call "
                        "would be used, not the scale being learned. Use a pyro_bbb layer with a learned prior, or "
                        "pyro_bbb.optim.Adam for this model. Nothing was changed."
                    )
                given = type(model).__name__
                raise ValueError(
                    f"IVON reads the learned prior of weight site {site!r} as it is now from the model's layers, but "
                    f"the guide's model (a {given}) is not the module that holds them "
                    "(the prior of the guide's first call would be used, not the scale being learned). Build the guide "
                    "on the network itself (MeanFieldGuide(bnn)), or use pyro_bbb.optim.Adam for this model."
                )
            if isinstance(base, EmpiricalBayesNormalDistribution):
                base, dynamic = base.given_posterior(torch.distributions.Normal(loc, sigma, validate_args=False)), True
            elif not isinstance(base, torch.distributions.Normal):
                raise ValueError(
                    f"IVON needs a Normal prior at weight site {site!r} (its precision sets the posterior width), got "
                    f"{type(base).__name__}. Use priors.Normal / FanInNormal / LearnedNormal / EmpiricalBayesNormal, "
                    "or pyro_bbb.optim.Adam for this model."
                )
            bases.append(base)
            key.append((id(base), tensor_version(base.loc), tensor_version(base.scale)))
        key = tuple(key)
        if not dynamic and self._prior_cache is not None and self._prior_cache[0] == key:
            return (*self._prior_cache[2], False)
        n = self.ess
        dtype = locs[0].dtype
        prior_loc = torch.cat([b.loc.detach().expand(p.shape).reshape(-1) for b, p in zip(bases, locs)]).to(dtype)
        delta = torch.cat([(1.0 / (n * b.scale.detach().square())).expand(p.shape).reshape(-1)
                           for b, p in zip(bases, locs)]).to(dtype)
        if not dynamic:
            self._prior_cache = (key, bases, (prior_loc, delta))  # (the bases held: their ids stay theirs)
        return prior_loc, delta, True

    def _refuse_unsupported_sites(self, sites: set[str]) -> None:
        """A clear error, before a step, for one of ``sites`` that IVON cannot train: a local latent (one per row,
        inside the model's data plate), or a site whose prior a hand-written model samples (read from the guide's
        prototype trace, not from a layer) depending on another latent site (``w ~ Normal(0, tau)``, ``tau`` sampled):
        the prototype's prior holds ``tau``'s first value, not the one being learned. The second is found once per
        site with Pyro's ``get_dependencies`` on the objective's latest call (unknown without one: not refused)."""
        unchecked = sites - self._fixed_checked
        if not unchecked:
            return
        nodes = self.guide.prototype_trace.nodes
        data_plate = data_plate_of(unwrap_handlers(self.guide.model))
        for site in sorted(unchecked):  # a latent per row: its curvature is one datum's, not N's
            plates = [f.name for f in nodes[site]["cond_indep_stack"] if f.name == data_plate]
            if plates:
                raise ValueError(
                    f"IVON trains global weights, each seen by all N={self.num_data} rows, but {site!r} is a local "
                    f"latent inside the data plate {plates[0]!r} (one per row): its curvature is one row's, which "
                    "IVON's width (from N times the curvature) would read wrongly. Use pyro_bbb.optim.Adam for this "
                    "model. Nothing was changed."
                )
        if self._model_call is None:
            return
        unchecked -= current_priors(unwrap_handlers(self.guide.model)).keys()  # (a layer's prior is read as it is now)
        if not unchecked:
            return
        model, args, kwargs = self._model_call
        try:
            with rng_untouched(), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                upstream = get_dependencies(model, args, kwargs)["prior_dependencies"]
        except Exception:  # (a model Pyro's provenance tracking cannot run: left unchecked)  # noqa: BLE001
            upstream = {}
        latent = {name for name, node in self.guide.prototype_trace.iter_stochastic_nodes()
                  if not node["is_observed"]}
        for site in sorted(unchecked):
            others = sorted(name for name in upstream.get(site, {}) if name != site and name in latent)
            if others and self._prior_moves(site, others):  # (provenance also flows through w1.new_zeros(...))
                raise ValueError(
                    f"IVON reads the prior of weight site {site!r} as fixed, but it depends on the latent site(s) "
                    f"{others} (a hierarchical prior): its precision changes with their draws, and IVON would keep "
                    "the one of the guide's first call. Use pyro_bbb.optim.Adam for this model, or give the site a "
                    "fixed prior. Nothing was changed."
                )
        self._fixed_checked |= unchecked

    def _prior_moves(self, site: str, others: list[str]) -> bool:
        """Whether the prior of ``site`` changes when the latent sites ``others`` it depends on (by provenance) take
        other values: the model run twice with them conditioned apart; ``True`` when that cannot be run."""
        model, args, kwargs = self._model_call
        nodes = self.guide.prototype_trace.nodes

        def prior_parameters(shift: float) -> list:
            values = {name: nodes[name]["value"].detach() * (1.0 + shift) + shift for name in others}
            with rng_untouched(), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trace = poutine.trace(poutine.condition(model, data=values)).get_trace(*args, **kwargs)
            base = strip_independent(trace.nodes[site]["fn"])
            return [getattr(base, name, None) for name in ("loc", "scale")]

        try:
            return any(not (isinstance(a, torch.Tensor) and torch.equal(a, b))
                       for a, b in zip(prior_parameters(0.0), prior_parameters(0.5)) if a is not None)
        except Exception:  # (a model that cannot run so: the provenance found stands)  # noqa: BLE001
            return True

    def _flat_state(self, sites: list[str], mu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The momentum and curvature of ``sites``, concatenated (kept so from step to step), in the dtype and on the
        device of their means ``mu`` (a state restored from a float32 checkpoint into a float64 model keeps its own)."""
        if self._flat is None or self._flat[0] != sites:
            self._sync_state()
            self._flat = (list(sites), torch.cat([self.site_state[s]["momentum"] for s in sites]),
                          torch.cat([self.site_state[s]["hess"] for s in sites]))
        if (self._flat[2].dtype, self._flat[2].device) != (mu.dtype, mu.device):
            self._flat = (self._flat[0], self._flat[1].to(mu), self._flat[2].to(mu))
        return self._flat[1], self._flat[2]

    def _sync_state(self) -> None:
        """Write the concatenated state back to :attr:`site_state`, site by site."""
        if self._flat is None:
            return
        sites, momentum, hess = self._flat
        sizes = [self.site_state[s]["hess"].numel() for s in sites]
        for site, m, h in zip(sites, momentum.split(sizes), hess.split(sizes)):
            self.site_state[site] = {"momentum": m.clone(), "hess": h.clone()}

    # -- one step ----------------------------------------------------------------------------------------------------
    def __call__(self, params: Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        params = list(dict.fromkeys(params))
        summed = gradients_summed(params)
        run = take_objective_run(params)
        self._model_call = getattr(run, "model_call", None)
        try:
            self._check_objective(run, summed)
            self._classify(params)
            self._refuse_unsupported_sites({self._roles[p][0] for p in params if self._roles[p][1] != "other"})
        except ValueError:
            for p in params:  # nothing moves, and the next step's gradients do not add to these
                p.grad = None
            if run is not None:  # nor was anything trained: the objective's step and trained weight are taken back
                run.refused()
            raise
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        others = []
        for p in params:
            site, role = self._roles[p]
            if role == "other" or p.grad is None:
                others.append(p)
            else:
                pairs.setdefault(site, {})[role] = p
        incomplete = [site for site, pair in pairs.items() if len(pair) != 2]
        for site in incomplete:  # a site whose mean or width this step did not reach: Adam leaves it alone too
            others.extend(pairs.pop(site).values())
        if pairs:
            self._ivon_step(pairs)
        self.adam([p for p in others if p.grad is not None])
        for p in params:
            p.grad = None

    @torch.no_grad()
    def _ivon_step(self, pairs: dict[str, dict[str, torch.Tensor]]) -> None:
        sites = list(pairs)
        new = [site for site in sites if site not in self.site_state]
        if new:  # the first sight of a site: its curvature (and width) set, its mean left where it is
            self._start(new, pairs)
            sites = [site for site in sites if site not in new]
            if not sites:
                return
        self.steps += 1
        d = self.defaults
        n, ess = float(self.num_data), self.ess  # gradients are read per datum of N; widths and prior pull use ess
        locs = [pairs[site]["loc"] for site in sites]
        raw_scales = [pairs[site]["scale"] for site in sites]
        sizes = [p.numel() for p in locs]
        mu = torch.cat([p.reshape(-1) for p in locs])
        grad_mu = torch.cat([p.grad.reshape(-1) for p in locs])
        grad_u = torch.cat([p.grad.reshape(-1) for p in raw_scales])
        if self._loss_scale != 1.0:  # the ELBO's own gradients: its curvature is read off them
            grad_mu.div_(self._loss_scale)
            grad_u.div_(self._loss_scale)
        own = self._own_widths(sites, raw_scales)  # (sigma, 1 / (N sigma d sigma / d u)) as set last step, or None
        if own is None:
            u = torch.cat([p.reshape(-1) for p in raw_scales])
            sigma = self._transform(u)
            slope = self._transform.log_abs_det_jacobian(u, sigma).exp_()  # d sigma / d u
            width_grad = grad_u.div_(slope.mul_(sigma).mul_(n))
        else:
            sigma = own[0]
            width_grad = grad_u.mul_(own[1])
        prior_loc, delta, moved = self._prior_vectors(sites, locs,
                                                      [s.view(p.shape) for s, p in zip(sigma.split(sizes), locs)])
        momentum, hess = self._flat_state(sites, mu)
        if moved:
            # the update keeps the precision h + delta positive for the delta it used, not h itself (a noisy estimate
            # may leave it slightly negative); a prior precision that has fallen since could take h + delta below
            # zero, so the curvature is floored at zero: the width is then at most the prior's
            hess.clamp_(min=0.0)

        # Price's estimate of the negative log-likelihood's curvature, less h: the ELBO's gradient with respect to the
        # width over N sigma, plus the KL's part removed, 1 / (N sigma^2) - delta, less h. Where the widths are the
        # ones set last step from this h and delta, 1 / (N sigma^2) = h + delta: the width-gradient term alone.
        difference = width_grad
        if own is None or moved:
            difference.add_(sigma.square().mul_(ess).reciprocal_()).sub_(delta).sub_(hess)
        pull = mu.sub(prior_loc).mul_(delta)  # the prior's per-datum gradient, delta (m - m_prior)
        beta1, rho = d["beta1"], (1.0 - d["beta2"]) * self._rate_ratio  # the curvature's step follows the schedule
        # momentum of the negative log-likelihood's per-datum gradient (the KL's part removed)
        momentum.mul_(beta1).add_(grad_mu, alpha=(1.0 - beta1) / n).sub_(pull, alpha=1.0 - beta1)
        precision = hess + delta
        hess.add_(difference, alpha=rho).addcdiv_(difference.square_(), precision, value=0.5 * rho**2)
        precision = torch.add(hess, delta, out=precision)
        step = torch.add(pull, momentum, alpha=1.0 / (1.0 - beta1**self.steps)).div_(precision)
        step.clamp_(-d["clip_radius"], d["clip_radius"])
        mu.addcmul_(step, self._step_unit(delta), value=-d["lr"])
        sigma = precision.mul_(ess).rsqrt_()
        u, slope = self._unconstrained(sigma)
        for p, q, m_part, u_part in zip(locs, raw_scales, mu.split(sizes), u.split(sizes)):
            p.copy_(m_part.view(p.shape))
            q.copy_(u_part.view(q.shape))
        self._width_cache = (sites, [(q, tensor_version(q)) for q in raw_scales], sigma,
                             slope.mul_(sigma).mul_(n).reciprocal_())

    def _step_unit(self, delta: torch.Tensor) -> torch.Tensor:
        """``hess_init + delta``, the unit of the means' step: kept while the prior precisions are the same tensor."""
        if self._unit is None or self._unit[0] is not delta:
            self._unit = (delta, delta + self.defaults["hess_init"])
        return self._unit[1]

    def _own_widths(self, sites: list[str], raw_scales: list[torch.Tensor]):
        """``(sigma, 1 / (N sigma d sigma / d u))`` as this optimizer set them last step, when nothing has written
        those tensors since; else None."""
        cache = self._width_cache
        if cache is not None and cache[0] == sites and all(
            q is cached and tensor_version(q) == version for q, (cached, version) in zip(raw_scales, cache[1])
        ):
            return cache[2], cache[3]
        return None

    def _unconstrained(self, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(u, d sigma / d u)`` for the widths ``sigma``; for the softplus of MeanFieldGuide's scales both come from
        one ``expm1``: ``u = sigma + log(1 - exp(-sigma))`` and the slope is ``1 - exp(-sigma)``."""
        if isinstance(self._transform, SoftplusTransform):
            slope = torch.expm1(sigma.neg()).neg_()
            return slope.log().add_(sigma), slope
        u = self._transform.inv(sigma)
        return u, self._transform.log_abs_det_jacobian(u, sigma).exp_()

    def _start(self, sites: list[str], pairs: dict[str, dict[str, torch.Tensor]]) -> None:
        """The first curvature of ``sites``: ``hess_init``, or read off the guide's widths (``keep_widths``); the
        widths set from it."""
        self._sync_state()
        self._flat = None
        locs = [pairs[site]["loc"] for site in sites]
        scales = [self._transform(pairs[site]["scale"]) for site in sites]
        _, delta, _ = self._prior_vectors(sites, locs, scales)
        self._prior_cache = None
        n = self.ess
        for site, loc, scale, part in zip(sites, locs, scales, delta.split([p.numel() for p in locs])):
            if self.defaults["keep_widths"]:
                hess = scale.detach().reshape(-1).square().mul(n).reciprocal().sub(part).clamp_(min=0.0)
            else:
                hess = torch.full((loc.numel(),), self.defaults["hess_init"], dtype=loc.dtype, device=loc.device)
            pairs[site]["scale"].copy_(self._transform.inv(1.0 / (n * (hess + part)).sqrt()).view(loc.shape))
            self.site_state[site] = {"momentum": torch.zeros_like(hess), "hess": hess}

    # -- where it can train ------------------------------------------------------------------------------------------
    def _check_objective(self, run: ObjectiveRun | None, summed: bool) -> None:
        """A clear error, before this step changes anything, unless the gradients (of ``run``; ``summed`` over more
        than one of its calls) are those of ``pyro_bbb.ELBO(num_data=self.num_data)`` at KL weight
        ``num_data / ess``, computed once since they were last applied (the mark the ELBO leaves on them:
        :mod:`pyro_bbb.infer.contract`): in a plain ``SVI`` loop as under ``fit`` or Lightning."""
        if run is None:
            raise ValueError(
                f"IVON got gradients that pyro_bbb.ELBO did not compute (e.g. pyro.infer.Trace_ELBO or "
                "TraceMeanField_ELBO, which do not scale a minibatch to the training set): it reads the likelihood's "
                f"curvature off the ELBO's gradients for N={self.num_data}. Use pyro_bbb.ELBO(num_data="
                f"{self.num_data}) as the objective, e.g. SVI(model, guide, optimizer, "
                f"pyro_bbb.ELBO(num_data={self.num_data})). Nothing was changed."
            )
        if summed:
            raise ValueError(
                "IVON got gradients summed over more than one pyro_bbb.ELBO call: a backward added onto gradients an "
                "earlier call (or step) left, neither applied nor zeroed in between (gradient accumulation, or a loop "
                "without zero_grads). IVON reads the likelihood's curvature off the gradient of one ELBO estimate. "
                "Zero the gradients after each step (SVI.step does; in a loop of your own, "
                "pyro.infer.util.zero_grads(params) after optimizer(params)); for a larger batch, pass it in one "
                "call, or use num_particles for more weight draws. Nothing was changed."
            )
        self._check_pairing(run.num_data, run.kl_weight, "build both with the training-set size N: IVON(guide, "
                            "num_data=N) and pyro_bbb.ELBO(num_data=N)")
        if run.scale is None or not run.scale > 0:
            raise ValueError(
                "IVON got gradients of a loss whose model and guide are scaled unalike (poutine.scale around one of "
                "them, or around some sites): the likelihood and the KL then count with a weight nobody chose, and "
                "IVON reads the likelihood's curvature off that loss. Scale both alike, poutine.scale(model, s) and "
                "poutine.scale(guide, s), or neither; a KL weight is pyro_bbb.ELBO(num_data=N, kl_weight=w) with "
                "IVON(guide, num_data=N, ess=N / w). Nothing was changed."
            )
        self._loss_scale = run.scale

    def _check_pairing(self, num_data: int | None, kl_weight: Any, num_data_fix: str) -> None:
        """The training-set size and KL weight the objective uses, against this optimizer's (``num_data_fix`` says
        how to make the sizes agree)."""
        if self.num_data != num_data:
            raise ValueError(
                f"IVON(num_data={self.num_data}) disagrees with the objective, which scales the data to N={num_data}: "
                f"{num_data_fix}. Nothing was changed."
            )
        weight = kl_weight.weight if isinstance(kl_weight, Constant) else kl_weight
        expected = self.num_data / self.ess
        if not (is_number(weight) and math.isclose(weight, expected, rel_tol=1e-6)):  # (a float32 weight too)
            fix = ("drop kl_weight" if expected == 1.0 else f"use kl_weight={expected:g}") + (
                f", or build IVON(guide, num_data={self.num_data}, ess={self.num_data}/kl_weight) for a constant "
                "kl_weight" if not callable(weight) else "")
            raise ValueError(
                f"kl_weight={kl_weight!r}: IVON sets each width from the likelihood's curvature and the prior's "
                f"precision for an effective sample size ess={self.ess:g}, the KL weight num_data / ess = "
                f"{expected:g} (no KL schedule or warm-up): {fix}. Nothing was changed."
            )

    def check_training(self, guide: Any, objective: Any, clip_norm: float | None = None,
                       *, clipping_option: str = "clip_norm") -> None:
        """A clear error, before any step, when a training loop would feed this optimizer gradients it cannot read:
        another guide, an ``objective`` (the :class:`pyro_bbb.ELBO` that will compute the gradients: the owner of the
        training-set size and the KL weight) with another ``N`` or a KL weight other than ``num_data / ess`` (it
        removes the closed-form KL's gradient to find the likelihood's), or clipped gradients (their size is its
        curvature). ``clipping_option`` names the loop's own clipping setting in the message.

        Examples
        --------
        >>> guide = MeanFieldGuide(BayesianLinear(2, 1))
        >>> IVON(guide, num_data=10).check_training(guide, pyro_bbb.ELBO(num_data=10, kl_weight=0.5))
        Traceback (most recent call last):
        ...
        ValueError: kl_weight=Constant(weight=0.5): IVON sets each width from the likelihood's curvature and the ...
        """
        if guide is not self.guide:
            raise ValueError(
                "the IVON optimizer was built for another guide; build it with this one: IVON(guide, ...)."
            )
        self._check_pairing(objective.num_data, objective.kl_weight,
                            f"pass IVON(guide, num_data={objective.num_data})")
        if clip_norm is not None:
            raise ValueError(
                f"{clipping_option}={clip_norm!r}: IVON reads the loss's curvature off the size of the gradients (the "
                "KL's part removed), so clipping them would corrupt the posterior widths. IVON limits its own steps "
                f"(IVON(clip_radius=...)); drop {clipping_option}."
            )

    # -- the PyroOptim interface ---------------------------------------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        """Use step size ``lr`` for the means from the next step on, and scale the curvature's step ``1 - beta2`` by
        the same factor (as natural-gradient VI steps the precision with the mean's rate: a decaying rate averages
        the curvature over more steps). Adam's rate for the other parameters is kept.

        Examples
        --------
        >>> optimizer = IVON(MeanFieldGuide(BayesianLinear(2, 1)), num_data=10)
        >>> optimizer.set_learning_rate(0.05)
        >>> optimizer.defaults["lr"]
        0.05
        """
        self._rate_ratio = check_positive("lr", lr) / self.defaults["lr"] * self._rate_ratio
        self.defaults["lr"] = lr

    def get_state(self) -> dict:
        """The curvature and momentum of every weight site by name, the step count, and the Adam's state.

        Examples
        --------
        >>> sorted(IVON(MeanFieldGuide(BayesianLinear(2, 1)), num_data=10).get_state())
        ['adam', 'sites', 'steps']
        """
        self._sync_state()
        sites = {site: {key: value.clone() for key, value in entry.items()} for site, entry in self.site_state.items()}
        return {"steps": self.steps, "sites": sites, "adam": self.adam.get_state()}  # (with moments restored, unused)

    def set_state(self, state_dict: dict) -> None:
        """Resume from :meth:`get_state`: each site's curvature and momentum by name (the widths follow from the
        curvature at the next step), the step count, the Adam's state."""
        if not isinstance(state_dict, dict) or not {"steps", "sites"} <= state_dict.keys():
            raise ValueError("set_state takes what IVON.get_state returned (keys 'steps', 'sites', 'adam').")
        self.steps = int(state_dict["steps"])
        self._flat = None
        self.site_state = {
            site: {key: value.clone() for key, value in entry.items()} for site, entry in state_dict["sites"].items()
        }
        self.adam.set_state(state_dict.get("adam") or {})

    def __repr__(self) -> str:
        settings = {"num_data": self.num_data, **({} if self.ess == self.num_data else {"ess": self.ess}),
                    **self.defaults}
        return ", ".join(f"{k}={v}" for k, v in settings.items()).join((f"{type(self).__name__}(", ")"))


def _is_learned(prior: torch.distributions.Distribution) -> bool:
    """Whether a Normal prior's location or scale is a learned parameter (it carries a gradient)."""
    return any(isinstance(value, torch.Tensor) and value.requires_grad
               for value in (getattr(prior, "loc", None), getattr(prior, "scale", None)))

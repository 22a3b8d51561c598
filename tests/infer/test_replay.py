"""The replayed fast path against the ELBO's own Pyro path: the same draws, losses and gradients, bit for bit; and
every case it must leave to the full path."""

import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI

from pyro_bbb import ELBO, MeanFieldGuide, priors
from pyro_bbb.infer.schedules import LinearWarmup
from pyro_bbb.nn import BayesianLinear

from ..helpers import Regression

# -- every backend against the reference path --------------------------------------------------------------------
PRIORS = {
    "default": lambda: None,  # the layers' default (a fan-in Normal)
    "normal": lambda: priors.Normal(0.0, 1.0),
    "learned": lambda: priors.LearnedNormal(),
    "empirical-bayes": lambda: priors.EmpiricalBayesNormal(),
    "scale-mixture": lambda: priors.ScaleMixtureNormal(),
}
CASES = [(prior, guide, estimator, particles)
         for prior in PRIORS for guide in ("MeanFieldGuide", "AutoNormal")
         for estimator in ("reparam", "flipout", "local_reparameterization") for particles in (1, 2)
         if guide == "MeanFieldGuide" or estimator == "reparam"]  # the estimators read MeanFieldGuide's posteriors


@pytest.mark.parametrize(("prior", "guide_kind", "estimator", "num_particles"), CASES)
def test_every_backend_equals_the_reference_path(prior, guide_kind, estimator, num_particles):
    """The ELBO with its replay backend on (``replay=True``, the default) against the reference path alone
    (``replay=False``): the same losses, terms and parameters after every SVI step, bit for bit, for every estimator,
    fixed / learned / empirical-Bayes / scale-mixture priors, MeanFieldGuide and AutoNormal, one or two particles; and
    the backend runs exactly where its rules say it applies (MeanFieldGuide, one particle, no trainable prior)."""
    from pyro.infer.autoguide import AutoNormal

    import pyro_bbb

    def build():
        def layer(i, o):
            made = PRIORS[prior]()
            return BayesianLinear(i, o) if made is None else BayesianLinear(i, o, prior=made)

        bnn = pyro_bbb.BNN(torch.nn.Sequential(layer(3, 6), torch.nn.Tanh(), layer(6, 1)),
                           pyro_bbb.likelihoods.Gaussian())  # a learned noise scale: a Monte Carlo KL too
        guide = MeanFieldGuide(bnn, init_scale=0.1) if guide_kind == "MeanFieldGuide" else AutoNormal(bnn)
        g = torch.Generator().manual_seed(4)
        return bnn, guide, torch.randn(24, 3, generator=g), torch.randn(24, 1, generator=g)

    handler = None if estimator == "reparam" else getattr(pyro_bbb, estimator)
    fast = _replay_run(build, True, steps=4, handler=handler, num_particles=num_particles)
    reference = _replay_run(build, False, steps=4, handler=handler, num_particles=num_particles)
    applies = guide_kind == "MeanFieldGuide" and num_particles == 1 and prior != "learned"
    assert fast[3] == [False] + [applies] * 3 and not any(reference[3])
    assert fast[0] == reference[0] and len(set(fast[0])) == 4
    assert fast[2].last_terms == reference[2].last_terms
    assert fast[1].keys() == reference[1].keys()
    for name in fast[1]:
        assert torch.equal(fast[1][name], reference[1][name]), name


# -- the replayed step -------------------------------------------------------------------------------------
def _replay_run(build, replay, steps=6, handler=None, kl_weight=1.0, data=None, **elbo_options):
    """Train ``build()`` -> (model, guide, x, y) for ``steps`` SVI steps; the losses, the final parameters, the ELBO
    and which steps were replayed."""
    import contextlib

    import pyro_bbb

    pyro.clear_param_store()
    torch.manual_seed(0)
    model, guide, x, y = build()
    elbo = ELBO(num_data=200, kl_weight=kl_weight, replay=replay, **elbo_options)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
    losses, replayed = [], []
    for _ in range(steps):
        with handler() if handler else contextlib.nullcontext():
            losses.append(svi.step(x, y))
        replayed.append(elbo.last_step_replayed)
    params = {name: p.detach().clone() for name, p in pyro.get_param_store().named_parameters()}
    return losses, params, elbo, replayed


def _regression_bnn():
    import pyro_bbb
    from pyro_bbb import likelihoods

    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.ReLU(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())  # a learned noise scale: a latent site with a Monte Carlo KL
    g = torch.Generator().manual_seed(1)
    return bnn, MeanFieldGuide(bnn, init_scale=0.1), torch.randn(20, 3, generator=g), torch.randn(20, 1, generator=g)


def _classifier_with_a_deterministic_layer():
    import pyro_bbb
    from pyro_bbb import likelihoods

    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), BayesianLinear(6, 3, prior=priors.Normal(0.2, 2)))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    g = torch.Generator().manual_seed(2)
    return bnn, MeanFieldGuide(bnn, init_scale=0.05), torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,),
                                                                                                      generator=g)


def _regression_bnn_with_other_priors():
    """Priors without a Normal-Normal closed form of constant parameters: empirical Bayes (its scale computed from
    the posterior), a Laplace (closed-form KL to a Normal) and a scale mixture (Monte Carlo KL at the draw)."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    net = torch.nn.Sequential(BayesianLinear(3, 8, prior=priors.EmpiricalBayesNormal()), torch.nn.ReLU(),
                              BayesianLinear(8, 8, prior=priors.Laplace(0.0, 0.5)), torch.nn.ReLU(),
                              BayesianLinear(8, 1, prior=priors.ScaleMixtureNormal()))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian())
    g = torch.Generator().manual_seed(3)
    return bnn, MeanFieldGuide(bnn, init_scale=0.1), torch.randn(20, 3, generator=g), torch.randn(20, 1, generator=g)


@pytest.mark.parametrize("build", [_regression_bnn, _classifier_with_a_deterministic_layer,
                                   _regression_bnn_with_other_priors],
                         ids=["regression", "classifier", "other-priors"])
@pytest.mark.parametrize("kl_weight", [1.0, LinearWarmup(4)], ids=["kl", "warmup"])
def test_replayed_steps_equal_the_full_pyro_path_bit_for_bit(build, kl_weight):
    """Same draws, losses, KL terms and parameters after every step as Pyro's handlers compute them -- including a
    deterministic layer's weights (point estimates), which the replayed step must also hand to the optimizer, and a
    learned noise scale (a constrained latent site whose KL is the Monte Carlo log q - log p)."""
    fast = _replay_run(build, True, kl_weight=kl_weight)
    full = _replay_run(build, False, kl_weight=kl_weight)
    assert fast[3] == [False] + [True] * 5 and not any(full[3])  # the first call (validated) runs in full
    assert fast[0] == full[0]
    assert fast[2].last_terms == full[2].last_terms
    assert fast[1].keys() == full[1].keys() and len(fast[1]) > 4
    for name in fast[1]:
        assert torch.equal(fast[1][name], full[1][name]), name



@pytest.mark.parametrize("estimator", [None, "flipout", "local_reparameterization"])
def test_vectorized_particles_run_the_full_path_with_or_without_replay(estimator):
    """Several particles (vectorized) are not replayed: the step is Pyro's full path whether ``replay`` is on or off,
    with the same numbers -- the batched KL included, which there sees a particle dimension on every posterior."""
    import pyro_bbb

    handler = getattr(pyro_bbb, estimator) if estimator else None
    runs = [_replay_run(_classifier_with_a_deterministic_layer, replay, steps=4, handler=handler,
                        kl_weight=LinearWarmup(3), num_particles=3, vectorize_particles=True)
            for replay in (True, False)]
    (fast_losses, fast_params, fast_elbo, fast_replayed), (losses, params, elbo, _) = runs
    assert not any(fast_replayed) and fast_losses == losses and fast_elbo.last_terms == elbo.last_terms
    assert all(torch.equal(fast_params[name], params[name]) for name in params)
    assert fast_elbo.last_terms["kl"] > 0 and len(set(fast_losses)) == 4

def test_replay_equals_the_full_path_through_fit_history_included(monkeypatch):
    import functools

    import pyro_bbb
    from pyro_bbb.train import step as training_step

    histories = []
    for replay in (True, False):
        monkeypatch.setattr(training_step, "ELBO", functools.partial(ELBO, replay=replay))
        pyro.clear_param_store()
        torch.manual_seed(0)
        model, guide, x, y = _classifier_with_a_deterministic_layer()
        histories.append(pyro_bbb.fit(model, guide, (x, y), epochs=4, batch_size=8, seed=3, progress=False,
                                      validation_data=(x, y)))
    for fast, full in zip(histories[0].records, histories[1].records, strict=True):
        assert {k: v for k, v in fast.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}


@pytest.mark.parametrize("estimator", ["flipout", "local_reparameterization"])
@pytest.mark.parametrize("build", [_regression_bnn, _classifier_with_a_deterministic_layer,
                                   _regression_bnn_with_other_priors],
                         ids=["regression", "classifier", "other-priors"])
def test_replay_under_flipout_and_local_reparameterization_equals_the_full_path(estimator, build):
    """The estimators' handlers stay active in a replayed step, told each weight's posterior as the guide's draw
    would tell them: same signs and noise in the same order, same numbers (with a KL warm-up)."""
    import pyro_bbb

    handler = getattr(pyro_bbb, estimator)
    fast = _replay_run(build, True, handler=handler, kl_weight=LinearWarmup(3))
    full = _replay_run(build, False, handler=handler, kl_weight=LinearWarmup(3))
    assert fast[3] == [False] + [True] * 5 and fast[0] == full[0]
    for name in fast[1]:
        assert torch.equal(fast[1][name], full[1][name]), name


def test_other_handlers_run_the_full_path_and_give_its_numbers():
    import contextlib

    import pyro_bbb

    @contextlib.contextmanager
    def two_estimators():
        with pyro_bbb.flipout(), pyro_bbb.local_reparameterization():
            yield

    for handler in (poutine.block, two_estimators):
        fast = _replay_run(_regression_bnn, True, handler=handler)
        full = _replay_run(_regression_bnn, False, handler=handler)
        assert not any(fast[3]) and fast[0] == full[0]


def test_a_model_whose_sites_change_falls_back_to_the_full_path():
    """A net that reads a layer only on wide batches, and one that emits a new sample site on some calls: the replayed
    step notices (an unread or a new site) and the step runs through Pyro's handlers, with that call's sites."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    class Sometimes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = BayesianLinear(2, 1), BayesianLinear(2, 1)

        def forward(self, x):
            return self.a(x) + (self.b(x) if x.shape[0] > 4 else 0.0)

    class Extra(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = BayesianLinear(2, 1)

        def forward(self, x):
            out = self.a(x)
            if x.shape[0] <= 4:
                out = out + pyro.sample("shift", dist.Normal(0.0, 1.0))
            return out

    for net, sites in ((Sometimes(), {"net.a.weight", "net.a.bias"}), (Extra(), {"net.a.weight", "net.a.bias"})):
        pyro.clear_param_store()
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(1.0))
        guide = MeanFieldGuide(bnn)
        elbo = ELBO(num_data=50)
        svi = SVI(bnn, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
        wide, narrow = torch.randn(8, 2), torch.randn(3, 2)
        for _ in range(2):
            svi.step(wide, torch.randn(8))
        assert elbo.last_step_replayed
        if isinstance(net, Extra):
            with pytest.raises(ValueError, match="'shift' has no posterior in the guide"):  # not a silent prior draw
                svi.step(narrow, torch.randn(3))
            continue
        loss = svi.step(narrow, torch.randn(3))
        assert not elbo.last_step_replayed and math.isfinite(loss)
        assert set(elbo.last_terms["kl_by_site"]) >= sites


def test_replay_is_off_for_what_it_does_not_cover():
    """Pruned guides, learned priors, a user's scale on the observation, several particles and a hand-written model
    run through Pyro's handlers."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    pyro.clear_param_store()
    model, guide, x, y = _regression_bnn()
    elbo = ELBO(num_data=200)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
    svi.step(x, y)
    svi.step(x, y)
    assert elbo.last_step_replayed
    keep = {name: torch.ones_like(p.loc, dtype=torch.bool) for name, p in guide.site_posteriors().items()
            if name.startswith("net.")}
    with guide.pruned(keep):
        svi.step(x, y)
    assert not elbo.last_step_replayed

    class ScaledLikelihood(likelihoods.Gaussian):
        def forward(self, output, y=None, data_plate="data"):
            with poutine.scale(scale=0.5):  # a user's own scale on the observation
                return super().forward(output, y, data_plate)

    cases = [
        lambda: pyro_bbb.BNN(BayesianLinear(3, 1), ScaledLikelihood(1.0)),
        lambda: pyro_bbb.BNN(BayesianLinear(3, 1, prior=priors.LearnedNormal()), likelihoods.Gaussian(1.0)),
        lambda: Regression(),
    ]
    for make in cases:
        for particles in (1, 2):
            pyro.clear_param_store()
            model = make()
            guide = MeanFieldGuide(model)
            elbo = ELBO(num_data=200, num_particles=particles)
            svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
            xs, ys = torch.randn(10, 3), torch.randn(10)
            for _ in range(3):
                svi.step(xs, ys if isinstance(model, pyro_bbb.BNN) else ys)
            assert not elbo.last_step_replayed


def test_replay_survives_a_cleared_param_store():
    """``pyro.clear_param_store()`` between steps: the guide registers its parameters anew on the full path, as it
    would without the replay, and the next steps replay again."""
    import pyro_bbb

    pyro.clear_param_store()
    model, guide, x, y = _regression_bnn()
    elbo = ELBO(num_data=200)
    svi = SVI(model, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
    for _ in range(2):
        svi.step(x, y)
    assert elbo.last_step_replayed
    pyro.clear_param_store()
    assert math.isfinite(svi.step(x, y)) and not elbo.last_step_replayed
    assert math.isfinite(svi.step(x, y)) and elbo.last_step_replayed


def test_a_models_num_data_set_between_steps_scales_the_next_step():
    """bnn.num_data = N (the fix the BNN's warning names) after replayed steps: the next step is scaled by N / B, as
    the full path scales it, not by the plan recorded while N was unknown."""
    import warnings

    import pyro_bbb
    from pyro_bbb import likelihoods

    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(200, 3), torch.randn(200)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    guide = MeanFieldGuide(bnn)
    elbo = ELBO()
    svi = SVI(bnn, guide, pyro_bbb.optim.Adam({"lr": 0.01}), elbo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the BNN's own word that it does not know N)
        for _ in range(3):
            svi.step(x[:20], y[:20])
    assert elbo.last_step_replayed and elbo.last_terms["num_data"] is None
    bnn.num_data = 200
    pyro.set_rng_seed(1)
    svi.step(x[:20], y[:20])
    scaled = elbo.last_terms["nll"]
    reference = ELBO()
    pyro.set_rng_seed(1)
    reference.loss(bnn, guide, x[:20], y[:20])  # one more optimizer step apart: close, not equal
    assert elbo.last_terms["num_data"] == reference.last_terms["num_data"] == 200
    assert float(scaled) == pytest.approx(float(reference.last_terms["nll"]), rel=0.05)


@pytest.mark.parametrize("validate", [False, True])
def test_a_models_own_num_data_scales_replayed_minibatches_after_a_full_batch_step(validate):
    """BNN(num_data=N) trained by pyro_bbb.ELBO() (no N of its own: the model's applies): a plan recorded on a
    full batch (B = N, scale 1) must scale a later minibatch by N / B, as the full path does, not by 1 -- bit for bit
    the same loss and gradients as without replay."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 2, generator=g), torch.randn(30, generator=g)
    runs = {}
    for replay in (True, False):
        pyro.clear_param_store()
        torch.manual_seed(0)
        bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5), num_data=30)
        guide = MeanFieldGuide(bnn, init_scale=0.1)
        elbo = ELBO(replay=replay)
        losses, grads, replayed = [], [], []
        with pyro.validation_enabled(validate):
            for step, rows in enumerate([30, 10, 30, 10, 10]):
                pyro.set_rng_seed(step)
                losses.append(elbo.loss_and_grads(bnn, guide, x[:rows], y[:rows]))
                losses.append(elbo.last_terms)  # N as the model declares it (the contract's N: IVON reads it)
                replayed.append(elbo.last_step_replayed)
                params = dict(pyro.get_param_store().named_parameters())
                grads.append({name: p.grad.clone() for name, p in params.items()})
                for p in params.values():
                    p.grad = None
        runs[replay] = losses, grads, replayed
    (fast, fast_grads, replayed), (full, full_grads, _) = runs[True], runs[False]
    assert any(replayed[1:])  # (the case itself: a minibatch step after a plan recorded on the full batch)
    assert fast == full and fast[3]["num_data"] == 30
    for a, b in zip(fast_grads, full_grads):
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    elbo = ELBO()  # a batch larger than the model's N after a plan: the full path's error, not a replayed number
    with pyro.validation_enabled(False):
        elbo.loss_and_grads(bnn, guide, x, y)
        elbo.loss_and_grads(bnn, guide, x, y)
        assert elbo.last_step_replayed
        with pytest.raises(ValueError, match="larger than the model's num_data=30"):
            elbo.loss_and_grads(bnn, guide, torch.randn(40, 2), torch.randn(40))


def test_a_layer_replaced_between_steps_brings_its_own_prior():
    """A layer replaced by one of the same shapes and site names but another prior: the replayed step kept the old
    layer's prior (its KL 9.8 where the new prior's is 86.0). The step after the change runs the full path, and the
    replay resumes from a plan of the new model, equal to the reference path throughout."""
    import pyro_bbb
    from pyro_bbb import likelihoods

    def build():
        net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(0.5))
        g = torch.Generator().manual_seed(5)
        return bnn, MeanFieldGuide(bnn, init_scale=0.1), torch.randn(20, 3, generator=g), torch.randn(20, 1,
                                                                                                        generator=g)

    def run(replay):
        pyro.clear_param_store()
        torch.manual_seed(0)
        bnn, guide, x, y = build()
        elbo = ELBO(num_data=100, replay=replay)
        svi = SVI(bnn, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
        losses, replayed, kls = [], [], []
        for step in range(5):
            if step == 2:
                bnn.net[2] = BayesianLinear(8, 1, prior=priors.Normal(0.0, 0.05))
            losses.append(svi.step(x, y))
            replayed.append(elbo.last_step_replayed)
            kls.append(float(elbo.last_terms["kl_by_site"]["net.2.weight"]))
        return losses, replayed, kls

    fast, reference = run(True), run(False)
    assert fast[1] == [False, True, False, True, True]
    assert fast[0] == reference[0] and fast[2] == reference[2]
    assert fast[2][2] > 5 * fast[2][1]  # the new, narrower prior's KL

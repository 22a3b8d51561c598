"""Whether a recorded guide was trained since by an objective other than pyro_bbb.ELBO: seen where it was, and
only there (auxiliary losses of one's own, gradients no step follows, pyro_bbb's own steps keep the record)."""

import pytest
import torch

import pyro_bbb
from pyro_bbb.infer.tempering import KLWeightChoice, kl_weight_of, record_kl_weight
from pyro_bbb.nn import BayesianLinear


@pytest.mark.parametrize("aux", ["summed after", "summed before", "backward after", "backward before"])
def test_a_users_own_pyro_bbb_loop_with_extra_terms_and_gradients_that_train_nothing_keeps_the_record(aux):
    """A loop of pyro_bbb.ELBO's differentiable_loss with an auxiliary term of the guide's (summed into one
    backward, or a backward of its own before or after the ELBO's, either order), a backward and
    torch.autograd.grad that no step follows, and a torch optimizer: the record chosen by validation (its scores)
    stays; the weight is the one it trains at."""
    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.1, progress=False)
    chosen = KLWeightChoice(kl_weight=0.1, chosen_by="validation", validation_nll={1.0: 0.5, 0.1: 0.4},
                            num_validation=4)
    record_kl_weight(guide, chosen)
    params = list(guide.parameters())
    optimizer = torch.optim.Adam(params, lr=0.01)
    elbo = pyro_bbb.ELBO(num_data=40, kl_weight=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        loss = elbo.differentiable_loss(bnn, guide, x, y)
        drawn = pyro.poutine.trace(guide).get_trace(x, y)  # a call of the guide's of one's own: a penalty on a draw
        penalty = 1e-3 * sum(site["value"].square().sum() for site in drawn.nodes.values() if site["type"] == "sample")
        if aux == "summed after":
            (loss + penalty).backward()
        elif aux == "summed before":
            (penalty + loss).backward()
        elif aux == "backward after":
            loss.backward()
            penalty.backward()
        else:
            penalty.backward()
            loss.backward()
        optimizer.step()
    assert kl_weight_of(guide) is chosen
    optimizer.zero_grad()
    drawn = pyro.poutine.trace(guide).get_trace(x, y)
    draws = [site["value"] for site in drawn.nodes.values() if site["type"] == "sample"]
    sum(draw.sum() for draw in draws).backward()  # (a look at the gradients, of one's own)
    torch.autograd.grad(elbo.differentiable_loss(bnn, guide, x, y), params)
    assert kl_weight_of(guide) is chosen


def test_outside_training_is_seen_after_a_loss_only_looked_at_and_in_a_functional_loop():
    """Pyro's Trace_ELBO steps, then a pyro_bbb.ELBO loss computed with gradients on but never differentiated (a
    logged value), leave the record saying "outside" (the look trained nothing at 0.05); so do gradients from
    torch.autograd.grad applied by hand."""
    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    for functional in (False, True):
        pyro.clear_param_store()
        bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
        guide = pyro_bbb.MeanFieldGuide(bnn)
        pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.05, progress=False)
        if functional:
            params = list(guide.parameters())
            for _ in range(2):
                grads = torch.autograd.grad(pyro.infer.Trace_ELBO().differentiable_loss(bnn, guide, x, y), params)
                with torch.no_grad():
                    for param, grad in zip(params, grads):
                        param -= 0.01 * grad
        else:
            svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
            for _ in range(2):
                svi.step(x, y)
            pyro_bbb.ELBO(num_data=40, kl_weight=0.05).differentiable_loss(bnn, guide, x, y)  # (a logged value)
        assert kl_weight_of(guide).chosen_by == "outside", functional


def test_a_nan_parameter_and_many_guides_of_the_same_parameters_are_handled():
    """A NaN in a parameter is not taken for a change (a backward that no step follows keeps the record); the hooks
    of a guide that is gone are removed, so guides built again and again over Pyro's param store do not pile up
    hooks on its parameters."""
    import gc
    import warnings

    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.05, progress=False)
    param = next(iter(guide.parameters()))
    with torch.no_grad():
        param[0, 0] = float("nan")
    sum(p.sum() for p in guide.parameters()).backward()  # (gradients from outside, no step)
    assert kl_weight_of(guide) is history.kl_weight_choice
    with torch.no_grad():
        param[0, 0] = 0.0
    assert kl_weight_of(guide).chosen_by == "outside"
    hooks_of = {id(p): len(p._backward_hooks or {}) for p in guide.parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (each new guide adopts the trained posterior, and says so)
        for _ in range(5):
            again = pyro_bbb.MeanFieldGuide(bnn)
            again(x, y)
            record_kl_weight(again, KLWeightChoice(kl_weight=0.05))
            del again
            gc.collect()
    assert {id(p): len(p._backward_hooks or {}) for p in guide.parameters()} == hooks_of


def test_a_record_is_not_called_outside_training_by_pyro_bbbs_own_steps_or_a_refit():
    """A fit after an outside call with gradients (no change), and a pyro_bbb.ELBO loop, keep their records."""
    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.05, progress=False)
    pyro.poutine.trace(guide).get_trace(x, y)  # noted, nothing changed
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, kl_weight=0.05, progress=False)
    assert kl_weight_of(guide) is history.kl_weight_choice and history.kl_weight_choice.chosen_by == "user"
    svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro_bbb.ELBO(num_data=40, kl_weight=0.05))
    for _ in range(3):
        svi.step(x, y)
    assert kl_weight_of(guide) is history.kl_weight_choice


def test_a_checkpointed_guide_module_and_a_state_put_back_by_hand_keep_the_record():
    """A guide module whose encoder runs under torch's (non-reentrant) checkpoint trained by a pyro_bbb.ELBO loop
    keeps its record; so does load_state_dict after a look at gradients of one's own (a state put back by hand is no
    step on outside gradients)."""
    import pyro
    import pyro.distributions as dist
    from pyro.nn import PyroModule
    from torch.utils.checkpoint import checkpoint

    x, y = torch.randn(40, 3), torch.randn(40)

    def model(x, y=None):
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("obs", dist.Normal(z, 0.5), obs=y)

    class Encoder(PyroModule):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = torch.nn.Linear(3, 8), torch.nn.Linear(8, 2)

        def forward(self, x, y=None):
            out = checkpoint(self.out, torch.tanh(self.hidden(x)), use_reentrant=False)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("z", dist.Normal(out[:, 0], torch.nn.functional.softplus(out[:, 1]) + 1e-3))

    pyro.clear_param_store()
    guide = Encoder()
    record_kl_weight(guide, KLWeightChoice(kl_weight=0.05))
    given = kl_weight_of(guide)
    optimizer = torch.optim.Adam(guide.parameters(), lr=0.01)
    elbo = pyro_bbb.ELBO(num_data=40, kl_weight=0.05)
    for step in range(3):
        optimizer.zero_grad()
        elbo.differentiable_loss(model, guide, x, y).backward()
        optimizer.step()
        if step == 0:
            best = {name: value.clone() for name, value in guide.state_dict().items()}  # (e.g. by a held-out score)
    assert kl_weight_of(guide) is given
    optimizer.zero_grad()
    sum(p.sum() for p in guide.parameters()).backward()  # (a look of one's own at gradients, no step)
    guide.load_state_dict(best)
    assert kl_weight_of(guide) is given


def test_the_digest_sees_changes_that_cancel_in_a_plain_sum():
    """Bits changed by +1, -2, +1 at neighbouring positions after an outside backward keep both the sum and the
    position-weighted sum of the bits; the odd pseudo-random weights per position see the change."""
    from pyro_bbb.infer.outside_training import trained_outside, watch_guide

    guide = torch.nn.Linear(4, 1, bias=False)
    watch_guide(guide)
    guide(torch.randn(3, 4)).sum().backward()  # (gradients from outside: the parameters are digested)
    bits = guide.weight.detach().view(-1).view(torch.int32)
    plain = bits.long().sum(), (bits.long() * torch.arange(1, 5)).sum()
    with torch.no_grad():
        bits[0] += 1
        bits[1] -= 2
        bits[2] += 1
    assert (bits.long().sum(), (bits.long() * torch.arange(1, 5)).sum()) == plain
    assert trained_outside(guide)


def test_a_pyro_bbb_backward_that_raised_hides_no_later_outside_training():
    """A backward of a pyro_bbb.ELBO loss that raises part-way (here a hook of one's own) leaves nothing behind that
    would take a later Pyro Trace_ELBO loop for pyro_bbb's own training."""
    import pyro

    from pyro_bbb import likelihoods

    x, y = torch.randn(40, 3), torch.randn(40)
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5), num_data=40)
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=0.05, progress=False)

    def fails(grad):
        raise RuntimeError("a hook of one's own fails")
    loss = pyro_bbb.ELBO(num_data=40, kl_weight=0.05).differentiable_loss(bnn, guide, x, y)
    loss.register_hook(fails)
    with pytest.raises(RuntimeError, match="fails"):
        loss.backward()
    svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    for _ in range(2):
        svi.step(x, y)
    assert kl_weight_of(guide).chosen_by == "outside"

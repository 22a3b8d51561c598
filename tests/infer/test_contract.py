"""The optimizer checks the objective that computed its gradients (``pyro_bbb.infer.contract``): IVON in a plain SVI
loop, with MeanFieldGuide or AutoNormal, and under Lightning, refuses the five wrong pairings with a clear error
before any parameter changes; the right pairing trains; two models trained alternately in one process are each
checked against their own objective."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.infer.util import zero_grads

import pyro_bbb
from pyro_bbb import ELBO, MeanFieldGuide, likelihoods
from pyro_bbb.infer.contract import ObjectiveRun, mark_objective_run, take_objective_run
from pyro_bbb.infer.schedules import Constant, LinearWarmup
from pyro_bbb.infer.tempering import kl_weight_of
from pyro_bbb.nn import BayesianLinear
from pyro_bbb.optim import IVON

N = 200

WRONG = {  # objective -> what the error names
    "warm-up": (lambda: ELBO(num_data=N, kl_weight=LinearWarmup(100)), "kl_weight=LinearWarmup"),
    "kl_weight 0.1": (lambda: ELBO(num_data=N, kl_weight=0.1), "kl_weight=Constant"),
    "another N": (lambda: ELBO(num_data=100), r"IVON\(num_data=200\) disagrees with the objective, which scales the "
                                              r"data to N=100"),
    "Trace_ELBO": (Trace_ELBO, "pyro_bbb.ELBO did not compute"),
    "TraceMeanField_ELBO": (TraceMeanField_ELBO, "pyro_bbb.ELBO did not compute"),
}


def _setup(guide_kind):
    pyro.clear_param_store()
    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1)),
                       likelihoods.Gaussian(scale=0.5))
    guide = MeanFieldGuide(bnn) if guide_kind == "MeanFieldGuide" else AutoNormal(bnn)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    guide(x[:32], y[:32])  # the parameters exist, as after a first step
    return bnn, guide, x, y


def _params():
    return {name: p.detach().clone() for name, p in pyro.get_param_store().named_parameters()}


@pytest.mark.parametrize("guide_kind", ["MeanFieldGuide", "AutoNormal"])
@pytest.mark.parametrize("wrong", list(WRONG))
def test_ivon_in_plain_svi_refuses_a_wrong_objective_with_nothing_changed(guide_kind, wrong):
    make_objective, message = WRONG[wrong]
    bnn, guide, x, y = _setup(guide_kind)
    svi = SVI(bnn, guide, IVON(guide, num_data=N), make_objective())
    before = _params()
    with pytest.raises(ValueError, match=message):
        svi.step(x[:32], y[:32])
    after = _params()
    assert after.keys() == before.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    assert all(p.grad is None for _, p in pyro.get_param_store().named_parameters())  # no stale gradient left


@pytest.mark.parametrize("guide_kind", ["MeanFieldGuide", "AutoNormal"])
def test_the_right_pairing_trains_and_a_later_switch_to_pyros_elbo_is_refused(guide_kind):
    bnn, guide, x, y = _setup(guide_kind)
    optimizer = IVON(guide, num_data=N)
    right = SVI(bnn, guide, optimizer, ELBO(num_data=N))
    start = _params()
    for i in range(3):
        right.step(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
    assert optimizer.steps == 2  # the first call sets the widths
    moved = _params()
    assert any(not torch.equal(moved[name], start[name]) for name in start)
    # gradients from Pyro's ELBO after pyro_bbb.ELBO's: the last run is the previous step's, not this one's
    with pytest.raises(ValueError, match="pyro_bbb.ELBO did not compute"):
        SVI(bnn, guide, optimizer, Trace_ELBO()).step(x[:32], y[:32])
    for name, value in moved.items():
        torch.testing.assert_close(_params()[name], value, rtol=0, atol=0)
    right.step(x[:32], y[:32])  # and the right objective trains on
    assert optimizer.steps == 3


def test_full_batch_without_num_data_is_the_right_n():
    """``ELBO()`` on the whole training set scales nothing: N is the batch, which IVON(num_data=N) accepts."""
    bnn, guide, x, y = _setup("MeanFieldGuide")
    optimizer = IVON(guide, num_data=N)
    svi = SVI(bnn, guide, optimizer, ELBO())
    svi.step(x, y)
    svi.step(x, y)
    assert optimizer.steps == 1  # the first call sets the widths, the second is an IVON step


def store_params():
    return [p for _, p in pyro.get_param_store().named_parameters()]


def test_each_gradient_computation_marks_the_parameters_it_reached_with_the_objectives_settings():
    bnn, guide, x, y = _setup("MeanFieldGuide")
    params = store_params()
    elbo = ELBO(num_data=N, kl_weight=0.5)
    elbo.loss(bnn, guide, x[:10], y[:10])  # no gradients: no mark
    assert take_objective_run(params) is None
    elbo.differentiable_loss(bnn, guide, x[:10], y[:10]).backward()
    run = take_objective_run(params)
    assert run.num_data == N and run.kl_weight.weight == 0.5
    assert take_objective_run(params) is None  # taken off
    elbo.loss_and_grads(bnn, guide, x[:10], y[:10])
    again = take_objective_run(params)
    assert again is not run and isinstance(again.kl_weight, Constant)
    # a parameter with a gradient from elsewhere spoils the set; so does one from another run
    stray = torch.zeros(1, requires_grad=True)
    stray.grad = torch.ones(1)
    mark_objective_run(params, ObjectiveRun(N, 1.0))
    assert take_objective_run(params + [stray]) is None
    mark_objective_run(params[:1], ObjectiveRun(N, 1.0))
    mark_objective_run(params[1:], ObjectiveRun(N, 1.0))
    assert take_objective_run(params) is None


@pytest.mark.parametrize("between", ["nothing", "clipped in place", "unscaled in place", "unscaled out of place",
                                     "clamped out of place", "zero_grads", "zero_", "set to None"])
def test_gradients_summed_over_two_elbo_calls_are_refused_unless_zeroed_between(between):
    """Gradient accumulation (two ``loss_and_grads`` calls, then one step) hands IVON the sum of two ELBO gradients:
    twice the curvature it reads. Refused with nothing changed, unless the gradients were zeroed between the calls;
    clipped or unscaled between them, in place (torch counts an in-place change, as it counts zeroing) or by a new
    tensor in the gradient's place (``p.grad = p.grad / 1024``), the second backward still adds onto the first's
    gradients."""
    bnn, guide, x, y = _setup("MeanFieldGuide")
    optimizer = IVON(guide, num_data=N)
    elbo = ELBO(num_data=N)
    SVI(bnn, guide, optimizer, elbo).step(x[:32], y[:32])  # the first call sets the widths
    params = store_params()
    elbo.loss_and_grads(bnn, guide, x[:32], y[:32])
    if between == "zero_grads":
        zero_grads(params)
    elif between == "zero_":
        for p in params:
            p.grad.zero_()
    elif between == "set to None":
        for p in params:
            p.grad = None
    elif between == "clipped in place":
        torch.nn.utils.clip_grad_norm_(params, 1e-3)
    elif between == "unscaled in place":
        for p in params:
            p.grad.div_(1024.0)
    elif between == "unscaled out of place":
        for p in params:
            p.grad = p.grad / 1024.0
    elif between == "clamped out of place":
        for p in params:
            p.grad = p.grad.clamp(-1e-3, 1e-3)
    elbo.loss_and_grads(bnn, guide, x[32:64], y[32:64])
    before = _params()
    if between not in ("zero_grads", "zero_", "set to None"):
        with pytest.raises(ValueError, match="summed over more than one pyro_bbb.ELBO call.*zero_grads"):
            optimizer(params)
        for name, value in before.items():
            torch.testing.assert_close(_params()[name], value, rtol=0, atol=0)
    else:
        optimizer(params)
        assert optimizer.steps == 1


def test_gradients_zeroed_in_place_are_read_without_a_device_sync_per_parameter():
    """A loop that zeroes in place (torch's zero_grad(set_to_none=False)) keeps the same gradient tensors, so the check
    reads whether each is all zeros: in one transfer per device, not one scalar read per parameter (each a host sync
    on a GPU, once per parameter per step)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ScalarReads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                ScalarReads.count += 1
            return func(*args, **(kwargs or {}))

    bnn, guide, x, y = _setup("MeanFieldGuide")
    elbo = ELBO(num_data=N)
    params = store_params()
    reads = {}
    for zeroing in ("released", "zeroed in place"):
        elbo.loss_and_grads(bnn, guide, x[:32], y[:32])
        for p in params:
            if zeroing == "released":
                p.grad = None
            else:
                p.grad.zero_()
        ScalarReads.count = 0
        with ScalarReads():
            elbo.loss_and_grads(bnn, guide, x[32:64], y[32:64])
        reads[zeroing] = ScalarReads.count
        zero_grads(params)
    assert len(params) == 8 and reads["zeroed in place"] == reads["released"]


def _ivon_after_one_step():
    bnn, guide, x, y = _setup("MeanFieldGuide")
    optimizer = IVON(guide, num_data=N)
    elbo = ELBO(num_data=N)
    SVI(bnn, guide, optimizer, elbo).step(x[:32], y[:32])  # the first call sets the widths
    return bnn, guide, x, y, optimizer, elbo


@pytest.mark.parametrize("loop", ["no_grad logging between", "zeroed before backward", "looked at, no backward"])
def test_own_loops_whose_gradients_are_one_elbos_train(loop):
    """Only a backward adds onto gradients: a loss scored under no_grad between the gradients and the step, a loss
    whose gradients were zeroed after it was computed but before its backward (torch's order), and a differentiable
    loss only looked at are not sums."""
    bnn, guide, x, y, optimizer, elbo = _ivon_after_one_step()
    params = store_params()
    for _ in range(2):
        if loop == "no_grad logging between":
            elbo.loss_and_grads(bnn, guide, x[:32], y[:32])
            with torch.no_grad():
                elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64])
        elif loop == "zeroed before backward":
            elbo.loss_and_grads(bnn, guide, x[:32], y[:32])  # (e.g. a look at the gradients' norm, first)
            loss = elbo.differentiable_loss(bnn, guide, x[:32], y[:32])
            zero_grads(params)
            loss.backward()
        else:
            elbo.loss_and_grads(bnn, guide, x[:32], y[:32])
            elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64])
        optimizer(params)
    assert optimizer.steps == 2


@pytest.mark.parametrize("loop", ["backward raised, then retried", "autograd.grad of a validation loss",
                                  "autograd.grad of a validation loss, gradients clamped out of place before",
                                  "functional: autograd.grad, then .grad set"])
def test_backwards_that_write_no_gradient_leave_one_elbos_gradients(loop):
    """A backward that raised part-way (a NaN check in a hook) leaves nothing the next backward counts; a validation
    loss differentiated by torch.autograd.grad (which writes no .grad) between the gradients and the step leaves them
    the training run's, even at another N; a functional loop that sets .grad from autograd.grad is the run's."""
    bnn, guide, x, y, optimizer, elbo = _ivon_after_one_step()
    params = store_params()
    if loop == "backward raised, then retried":
        def nan_check(grad):
            raise FloatingPointError("NaN gradient: skip the batch")

        loss = elbo.differentiable_loss(bnn, guide, x[:32], y[:32])
        loss.register_hook(nan_check)
        with pytest.raises(FloatingPointError):
            loss.backward()
        for p in params:
            p.grad = None
        elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
    elif loop.startswith("autograd.grad of a validation loss"):
        elbo.loss_and_grads(bnn, guide, x[:32], y[:32])
        if loop.endswith("clamped out of place before"):  # still the training run's gradients, clamped
            for p in params:
                p.grad = p.grad.clamp(-10.0, 10.0)
        validation = ELBO(num_data=50).differentiable_loss(bnn, guide, x[150:], y[150:])
        torch.autograd.grad(validation, params, allow_unused=True)
    else:
        loss = elbo.differentiable_loss(bnn, guide, x[:32], y[:32])
        for p, grad in zip(params, torch.autograd.grad(loss, params)):
            p.grad = grad
    optimizer(params)
    assert optimizer.steps == 1


@pytest.mark.parametrize("loop", ["zeros kept, input gradients first", "zeroed through .data"])
def test_zero_gradients_kept_in_place_are_not_a_sum(loop):
    """Gradients held as zero tensors, with an input-gradient pass (torch.autograd.grad w.r.t. x, FGSM-style) before
    the training backward, and gradients zeroed through .data (which torch's version count does not see): one
    ELBO's gradient each step."""
    bnn, guide, x, y, optimizer, elbo = _ivon_after_one_step()
    params = store_params()
    for _ in range(2):
        if loop == "zeros kept, input gradients first":
            for p in params:
                p.grad = torch.zeros_like(p)
            xa = x[:32].clone().requires_grad_()
            torch.autograd.grad(elbo.differentiable_loss(bnn, guide, xa, y[:32]), [xa])
        else:
            elbo.loss_and_grads(bnn, guide, x[:32], y[:32])  # a look at the gradients
            for p in params:
                p.grad.data.zero_()
        elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
        optimizer(params)
    assert optimizer.steps == 2


@pytest.mark.parametrize("zeroing", ["set_to_none=True", "set_to_none=False"])
def test_an_auxiliary_loss_on_a_torch_trained_body_leaves_ivons_own_gradients_one_elbos(zeroing):
    """A deterministic body trained by a torch optimizer with a penalty of its own (its own backward, before the
    ELBO's): the body's gradients are a sum, but IVON updates the guide's parameters alone, whose gradients come from
    one ELBO call: accepted. The sum IVON must refuse is one on its own parameters."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    guide = MeanFieldGuide(bnn)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    guide(x[:32], y[:32])
    ivon, elbo = IVON(guide, num_data=N), ELBO(num_data=N)
    body = torch.optim.Adam(net[0].parameters(), lr=1e-3)
    for i in range(3):
        body.zero_grad(set_to_none=zeroing == "set_to_none=True")
        (1e-3 * sum(p.square().sum() for p in net[0].parameters())).backward()
        elbo.differentiable_loss(bnn, guide, x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]).backward()
        ivon(list(guide.parameters()))
        body.step()
    assert ivon.steps == 2  # (the first call sets the widths)
    # and the guide's own gradients summed over two ELBO calls are still refused
    elbo.differentiable_loss(bnn, guide, x[:32], y[:32]).backward()
    elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
    with pytest.raises(ValueError, match="summed over more than one"):
        ivon(list(guide.parameters()))


def test_what_a_refused_step_takes_back_stays_bounded_when_a_gradient_is_never_zeroed():
    """A deterministic body that the user's torch optimizer does not train: its gradient is never zeroed, so each
    run adds onto the last. What a refusal would take back stays one entry per thing recorded, not one per step."""
    from pyro_bbb.infer import contract

    pyro.clear_param_store()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), BayesianLinear(4, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
    guide = MeanFieldGuide(bnn)
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    guide(x, y)
    elbo = ELBO(num_data=N)
    optimizer = torch.optim.Adam(guide.parameters(), lr=1e-3)
    for _ in range(50):
        optimizer.zero_grad()
        elbo.differentiable_loss(bnn, guide, x, y).backward()
        optimizer.step()
    body = contract._marks[net[0].weight]
    assert body.run.summed and len(body.run.take_back) == 2  # the ELBO's step and the guide's record


@pytest.mark.parametrize("how", ["two backwards", "two backwards, clipped between",
                                 "two backwards, unscaled out of place between", "two losses, one backward",
                                 "loss_and_grads then backward"])
def test_differentiable_losses_summed_by_the_callers_backward_are_refused(how):
    """differentiable_loss(...).backward() twice without zeroing, two losses added and one backward, or a backward
    onto loss_and_grads' gradients: IVON would read the sum of two ELBO gradients."""
    bnn, guide, x, y, optimizer, elbo = _ivon_after_one_step()
    params = store_params()
    if how == "two backwards":
        elbo.differentiable_loss(bnn, guide, x[:32], y[:32]).backward()
        elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
    elif how == "two backwards, clipped between":
        elbo.differentiable_loss(bnn, guide, x[:32], y[:32]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1e-3)
        elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
    elif how == "two backwards, unscaled out of place between":
        elbo.differentiable_loss(bnn, guide, x[:32], y[:32]).backward()
        for p in params:
            p.grad = p.grad / 1024.0
        elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
    elif how == "two losses, one backward":
        (elbo.differentiable_loss(bnn, guide, x[:32], y[:32])
         + elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64])).backward()
    else:
        elbo.loss_and_grads(bnn, guide, x[:32], y[:32])
        elbo.differentiable_loss(bnn, guide, x[32:64], y[32:64]).backward()
    before = _params()
    with pytest.raises(ValueError, match="summed over more than one"):
        optimizer(params)
    for name, value in before.items():
        torch.testing.assert_close(_params()[name], value, rtol=0, atol=0)
    elbo.differentiable_loss(bnn, guide, x[:32], y[:32]).backward()  # one, on released gradients: trains
    optimizer(params)
    assert optimizer.steps == 1


@pytest.mark.parametrize("wrapped", [False, True])
def test_fit_with_ivon_after_a_look_at_the_gradients_trains(wrapped):
    """Gradients the user's own ELBO call left before fit (a look at their norm) are not fit's: its first step
    releases them, and IVON trains, also for a model wrapped in a handler (not a module itself) whose deterministic
    body's gradients are no guide's."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1)),
                       likelihoods.Gaussian(scale=0.5))
    guide = MeanFieldGuide(bnn)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    model = poutine.scale(bnn, 1.0) if wrapped else bnn
    ELBO(num_data=N).loss_and_grads(model, guide, x[:32], y[:32])
    optimizer = IVON(guide, num_data=N)
    pyro_bbb.fit(model, guide, (x, y), epochs=1, batch_size=32, kl_weight=1, optimizer=optimizer, progress=False)
    assert optimizer.steps == 6


def test_marks_do_not_keep_a_trained_model_alive():
    """The marks on the parameters (and what takes a refused step back) hold the model and guide weakly: with Adam,
    which takes no mark off, a deleted model and guide were kept alive for good, with their data."""
    import gc
    import weakref

    alive = []
    for _ in range(2):
        bnn, guide, x, y = _setup("MeanFieldGuide")
        SVI(bnn, guide, pyro.optim.Adam({"lr": 1e-2}), ELBO(num_data=N)).step(x[:32], y[:32])
        alive += [weakref.ref(bnn), weakref.ref(guide)]
        del bnn, guide
    pyro.clear_param_store()
    gc.collect()
    assert [ref() for ref in alive] == [None] * 4


def test_a_mark_goes_with_its_parameter_and_is_not_read_off_a_new_one_at_its_address():
    """The marks are held by identity, weakly: a deleted parameter's entry goes with it, and a parameter that a
    dead one's id is reused for (CPython reuses addresses) carries no mark until a gradient computation leaves one."""
    import gc
    import weakref

    from pyro_bbb.infer import contract

    first = torch.zeros(3, requires_grad=True)
    first.grad = torch.ones(3)
    run = mark_objective_run([first], ObjectiveRun(N, 1.0))
    before = len(contract._marks)
    assert contract._marks.get(first).run is run
    del first
    gc.collect()
    assert len(contract._marks) == before - 1
    second = torch.zeros(3, requires_grad=True)
    contract._marks._entries[id(second)] = (weakref.ref(torch.zeros(1)), "a dead parameter's mark")  # an id reused
    gc.collect()
    assert contract._marks.get(second) is None and take_objective_run([second]) is None
    second.grad = torch.ones(3)
    assert mark_objective_run([second], run) is run and contract._marks[second].run is run
    assert take_objective_run([second]) is run and contract._marks.get(second) is None


def test_a_refused_step_is_not_counted_as_trained():
    """The ELBO counts a gradient call as a training step (the KL schedule's step, the weight the guide is noted as
    trained at, which summary, evidence and save report); a step the optimizer refuses takes both back."""
    bnn, guide, x, y = _setup("MeanFieldGuide")
    optimizer = IVON(guide, num_data=N)
    right = ELBO(num_data=N)
    svi = SVI(bnn, guide, optimizer, right)
    for i in range(3):
        svi.step(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
    assert right.step == 3 and kl_weight_of(guide).kl_weight == 1.0
    tempered = ELBO(num_data=N, kl_weight=0.1)  # not IVON's pairing: refused
    with pytest.raises(ValueError, match="kl_weight=Constant"):
        SVI(bnn, guide, optimizer, tempered).step(x[:32], y[:32])
    assert tempered.step == 0
    assert kl_weight_of(guide).kl_weight == 1.0  # still the Bayes posterior it was trained as
    # two calls summed: both taken back
    right.loss_and_grads(bnn, guide, x[:32], y[:32])
    right.loss_and_grads(bnn, guide, x[32:64], y[32:64])
    assert right.step == 5
    with pytest.raises(ValueError, match="summed"):
        optimizer(store_params())
    assert right.step == 3
    svi.step(x[:32], y[:32])
    assert right.step == 4 and optimizer.steps == 3


def _two_models():
    """Two models in one param store with distinct sites (A: 3-8-1 with N=200, B: 3-4-1 with N=100), each with
    MeanFieldGuide; B's is handed to SVI wrapped in a handler."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    models = {}
    for name, net, n in [("A", torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.Tanh(), BayesianLinear(8, 1)), N),
                         ("B", torch.nn.Sequential(torch.nn.Identity(), BayesianLinear(3, 4), torch.nn.Tanh(),
                                                   BayesianLinear(4, 1)), N // 2)]:
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))
        guide = MeanFieldGuide(bnn)
        x, y = torch.randn(n, 3), torch.randn(n, 1)
        guide(x[:32], y[:32])
        models[name] = (bnn, guide, x, y, n)
    assert not {p for p in models["A"][1].parameters()} & {p for p in models["B"][1].parameters()}
    return models


def test_two_models_trained_alternately_are_each_checked_against_their_own_objective():
    models = _two_models()
    (bnn_a, guide_a, x_a, y_a, n_a), (bnn_b, guide_b, x_b, y_b, n_b) = models["A"], models["B"]
    wrapped_b = poutine.scale(guide_b, scale=1.0)  # a guide wrapped in a handler: not a module
    ivon_a, ivon_b = IVON(guide_a, num_data=n_a), IVON(guide_b, num_data=n_b)
    svi_a = SVI(bnn_a, guide_a, ivon_a, ELBO(num_data=n_a))
    svi_b = SVI(bnn_b, wrapped_b, ivon_b, ELBO(num_data=n_b))
    for i in range(3):  # alternately, each with its own objective: accepted
        svi_a.step(x_a[32 * i:32 * (i + 1)], y_a[32 * i:32 * (i + 1)])
        svi_b.step(x_b[32 * i:32 * (i + 1)], y_b[32 * i:32 * (i + 1)])
    assert ivon_a.steps == ivon_b.steps == 2
    before = _params()
    # each with the other's objective (the other's N): refused, nothing changed
    with pytest.raises(ValueError, match=rf"IVON\(num_data={n_a}\) disagrees .* N={n_b}"):
        SVI(bnn_a, guide_a, ivon_a, ELBO(num_data=n_b)).step(x_a[:32], y_a[:32])
    with pytest.raises(ValueError, match=rf"IVON\(num_data={n_b}\) disagrees .* N={n_a}"):
        SVI(bnn_b, wrapped_b, ivon_b, ELBO(num_data=n_a)).step(x_b[:32], y_b[:32])
    # A's objective has just run (its gradients not yet applied); B's gradients then come from Pyro's Trace_ELBO: a
    # record of "the latest run in this process" would have let B take A's run; B's own parameters say otherwise
    ELBO(num_data=n_b).loss_and_grads(bnn_a, guide_a, x_a[:32], y_a[:32])
    with pytest.raises(ValueError, match="pyro_bbb.ELBO did not compute"):
        SVI(bnn_b, wrapped_b, ivon_b, Trace_ELBO()).step(x_b[:32], y_b[:32])
    for name, value in before.items():
        torch.testing.assert_close(_params()[name], value, rtol=0, atol=0)
    # A's gradients from that run were never applied: a step now would add onto them
    with pytest.raises(ValueError, match="summed over more than one"):
        svi_a.step(x_a[:32], y_a[:32])
    svi_a.step(x_a[:32], y_a[:32])  # the refused step released them: each trains on with its own
    svi_b.step(x_b[:32], y_b[:32])
    assert ivon_a.steps == ivon_b.steps == 3


def test_under_lightning_an_objective_swapped_in_after_construction_is_refused():
    """BayesianLightningModule checks its own settings up front; an ELBO replaced afterwards (a subclass, a user's
    edit) is caught by the optimizer at its step, with the guide unchanged."""
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_bbb.train.lightning import BayesianLightningModule

    bnn, guide, x, y = _setup("MeanFieldGuide")
    module = BayesianLightningModule(bnn, guide, num_data=N, optimizer=IVON(guide, num_data=N))
    module.elbo = ELBO(num_data=N, kl_weight=0.1)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="kl_weight=Constant"):
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32))
    for name, value in guide.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)

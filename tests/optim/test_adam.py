import copy

import pyro
import pytest
import torch

import pyro_bbb


def test_joint_adam_makes_the_same_updates_as_pyros_per_parameter_adam():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(shape)) for shape in [(3, 2), (4,), (2,)]]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    joint, per_parameter = pyro_bbb.optim.Adam(lr=0.05), pyro.optim.Adam({"lr": 0.05})
    for step in range(6):
        active = [0, 1] if step < 2 else [0, 1, 2] if step % 2 else [0, 2]  # the third joins late, one skips steps
        grads = [torch.randn_like(p) for p in ours]
        for group in (ours, theirs):
            for i, p in enumerate(group):
                p.grad = grads[i].clone() if i in active else None
        joint([ours[i] for i in active])
        per_parameter([theirs[i] for i in active])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_trains_with_svi_and_is_the_default_of_fit():
    model = pyro_bbb.BNN(pyro_bbb.nn.BayesianLinear(2, 1), pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    svi = pyro.infer.SVI(model, guide, pyro_bbb.optim.Adam(lr=0.05), pyro_bbb.ELBO(num_data=40))
    x = torch.randn(40, 2)
    y = x @ torch.tensor([1.0, -2.0])
    losses = [svi.step(x, y) for _ in range(200)]
    assert losses[-1] < 0.01 * losses[0]
    assert repr(pyro_bbb.optim.Adam(lr=0.01)).startswith("Adam(lr=0.01")


def test_state_round_trip():
    p = pyro.param("round_trip", torch.zeros(2)).unconstrained()
    p.grad = torch.ones(2)
    optimizer = pyro_bbb.optim.Adam()
    with pytest.raises(ValueError, match="get_state returned"):
        optimizer.set_state({"joint_adam": None})
    optimizer([p])
    state = optimizer.get_state()
    assert set(state) == {"round_trip"} and state["round_trip"]["step"] == 1
    optimizer.set_state(state)
    p.grad = torch.ones(2)
    optimizer([p])
    assert optimizer.get_state()["round_trip"]["step"] == 2


@pytest.mark.parametrize("optimizer", ["pyro_bbb", "pyro"])
def test_a_run_restored_from_the_param_store_and_optimizer_state_continues_bit_for_bit(optimizer):
    """Save Pyro's param store and the optimizer's state mid-run, restore both into a fresh optimizer (the param store
    replaces its tensors), train on: the same parameters as the uninterrupted run, as with Pyro's own Adam."""
    from pyro.infer import SVI

    from ..helpers import regression_model, small_data

    x, y = small_data(40)

    def make():
        return pyro_bbb.optim.Adam(lr=0.05) if optimizer == "pyro_bbb" else pyro.optim.Adam({"lr": 0.05})

    def run(restore_after=None):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = regression_model()
        guide = pyro_bbb.MeanFieldGuide(model)
        optim = make()
        svi = SVI(model, guide, optim, pyro_bbb.ELBO(num_data=40))
        for step in range(12):
            if step == restore_after:
                params, state = pyro.get_param_store().get_state(), optim.get_state()
                optim = make()
                optim.set_state(state)
                pyro.get_param_store().set_state(params)
                svi = SVI(model, guide, optim, pyro_bbb.ELBO(num_data=40))
            svi.step(x, y)
        return {name: value.detach().clone() for name, value in pyro.get_param_store().items()}

    uninterrupted, restored = run(), run(restore_after=6)
    assert uninterrupted.keys() == restored.keys()
    assert all(torch.equal(uninterrupted[name], restored[name]) for name in uninterrupted)


def test_set_learning_rate_applies_to_the_parameters_there_and_those_that_join_later():
    first, second = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = pyro_bbb.optim.Adam(lr=0.1)
    first.grad = torch.ones(2)
    optimizer([first])
    optimizer.set_learning_rate(0.01)
    first.grad, second.grad = torch.ones(2), torch.ones(2)
    optimizer([first, second])  # Adam with a constant gradient moves every coordinate by the learning rate
    torch.testing.assert_close(first.detach(), torch.full((2,), -0.11))
    torch.testing.assert_close(second.detach(), torch.full((2,), -0.01))


def test_runs_torchs_fused_kernel_and_falls_back_to_foreach_where_torch_has_none(monkeypatch):
    from pyro_bbb.optim import adam as optim

    def run(optimizer):
        torch.manual_seed(1)
        params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3, dtype=torch.float64))]
        for _ in range(4):
            for p in params:
                p.grad = torch.randn_like(p)
            optimizer(params)
        return params, optimizer.optimizer.param_groups[0]

    fused_params, fused_group = run(optim.Adam(lr=0.1))
    assert fused_group["fused"] and not fused_group["foreach"]  # CPU has a fused Adam kernel in this torch

    real_adam = torch.optim.Adam

    def adam_without_fused_kernel(params, **kwargs):  # what torch < 2.4 does for CPU tensors
        if kwargs.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real_adam(params, **kwargs)

    monkeypatch.setattr(optim, "_FUSED_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(torch.optim, "Adam", adam_without_fused_kernel)
    foreach_params, foreach_group = run(optim.Adam(lr=0.1))
    assert foreach_group["foreach"] and not foreach_group["fused"]
    assert "cpu" not in optim._FUSED_DEVICES  # asked once: later optimizers go straight to foreach
    for a, b in zip(fused_params, foreach_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _train(direct: bool, monkeypatch) -> tuple[list, list]:
    """Ten steps of a joint Adam through every situation the direct fused call must stand aside for."""
    from pyro_bbb.optim import adam as optim

    if not direct:
        monkeypatch.setattr(optim._FusedStep, "for_step", classmethod(lambda cls, params, optimizer: None))
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(4, 3), (4,), (2,), (3, 3)]]
    optimizer, used = optim.Adam(lr=0.05), []
    for step in range(12):
        active = params[:2] if step < 3 else params[:3] if step < 6 or step == 8 else params  # joins, skips
        for p in params:
            p.grad = torch.randn_like(p) if any(p is a for a in active) else None
        if step == 7:  # a missing gradient among the step's parameters
            active[1].grad = None
        if step == 9:
            optimizer.set_learning_rate(0.01)
        if step == 7:
            saved = copy.deepcopy(optimizer.get_state())
        if step == 10:
            optimizer.set_state(saved)  # an earlier state restored (new tensors, other moments)
        optimizer(active)
        used.append(optimizer._fused_step is not None)
    return [p.detach().clone() for p in params], used


def test_the_direct_fused_call_makes_torchs_updates_bit_for_bit(monkeypatch):
    direct, used = _train(True, monkeypatch)
    assert sum(used) >= 6  # it ran (and stood aside where it must)
    with monkeypatch.context() as patched:
        reference, _ = _train(False, patched)
    for a, b in zip(direct, reference, strict=True):
        assert torch.equal(a, b)


def test_the_direct_fused_call_stands_aside_for_step_hooks():
    from pyro_bbb.optim import adam as optim

    p = torch.nn.Parameter(torch.zeros(3))
    optimizer, calls = optim.Adam(lr=0.1), []
    for _ in range(2):
        p.grad = torch.ones(3)
        optimizer([p])
    optimizer.optimizer.register_step_post_hook(lambda *args: calls.append(1))
    p.grad = torch.ones(3)
    optimizer([p])
    assert calls == [1] and p.grad is None


def test_pyros_dict_form_is_taken_and_bad_arguments_are_clear_errors_at_construction():
    """``pyro_bbb.optim.Adam({"lr": 1e-2})`` (``pyro.optim.Adam``'s form) makes the same steps as
    ``pyro.optim.Adam({"lr": 1e-2})``; an argument it does not take, a per-parameter function or a bad number is an
    error when the optimizer is built, not at its first step."""
    import pyro.optim

    steps = []
    from pyro_bbb.optim import Adam

    for optimizer in (Adam({"lr": 1e-2, "betas": (0.8, 0.99)}), pyro.optim.Adam({"lr": 1e-2, "betas": (0.8, 0.99)})):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 5))
        for _ in range(3):
            p.grad = p.detach() ** 2 - 0.3
            optimizer([p])
        steps.append(p.detach().clone())
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"\['amsgrad'\]"):
        Adam({"lr": 1e-2, "amsgrad": True})
    with pytest.raises(TypeError, match="per-parameter"):
        Adam(lambda module, name: {"lr": 1e-2})
    with pytest.raises(ValueError, match="`lr` must be a finite number >= 0"):
        Adam(lr="0.01")


def test_restored_moments_of_another_shape_are_refused_before_the_step():
    """torch's fused kernel does not check the moments' shapes: a state saved from another model read past the end of
    a (2,) moment for a (3, 4) parameter, or stepped with broadcast garbage. Refused, naming the parameter; nothing
    moves, and the right state is taken afterwards."""
    p = pyro.param("restored_shape", torch.zeros(3, 4)).unconstrained()
    optimizer = pyro_bbb.optim.Adam(lr=0.1)
    wrong = {"exp_avg": torch.ones(2), "exp_avg_sq": torch.ones(2), "step": torch.tensor(3.0)}
    optimizer.set_state({"restored_shape": wrong})
    p.grad = torch.ones(3, 4)
    with pytest.raises(ValueError, match=r"'exp_avg' of shape \(2,\) for parameter 'restored_shape'.*\(3, 4\)"):
        optimizer([p])
    assert torch.equal(p.detach(), torch.zeros(3, 4))
    right = {"exp_avg": torch.ones(3, 4, dtype=torch.float64), "exp_avg_sq": torch.ones(3, 4),
             "step": torch.tensor(3.0)}
    optimizer.set_state({"restored_shape": right})
    optimizer([p])
    state = optimizer.get_state()["restored_shape"]
    assert state["step"] == 4 and state["exp_avg"].dtype == torch.float32
    expected = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3, 4))], lr=0.1)
    reference = expected.param_groups[0]["params"][0]
    expected.state[reference] = {key: value.float() if key != "step" else value for key, value in right.items()}
    reference.grad = torch.ones(3, 4)
    expected.step()
    torch.testing.assert_close(p.detach(), reference.detach())


def test_a_learning_rate_set_later_is_checked_as_the_constructor_checks_it():
    """set_learning_rate(-0.01) after a step climbed the loss (torch's built optimizer checks nothing)."""
    optimizer = pyro_bbb.optim.Adam(lr=0.01)
    p = torch.zeros(2, requires_grad=True)
    p.grad = torch.ones(2)
    optimizer([p])
    for bad in (-0.01, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="`lr`"):
            optimizer.set_learning_rate(bad)
    assert optimizer.optimizer.param_groups[0]["lr"] == 0.01

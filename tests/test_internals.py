"""One test per private Pyro or torch name that ``pyro_bbb._internals`` uses: a release that moves or changes one
fails the test named after it, with the versions the adapter was checked on."""

import importlib.metadata

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_bbb import _internals
from pyro_bbb.nn import BayesianLinear


def _autonormal():
    guide = AutoNormal(BayesianLinear(2, 1))
    guide(torch.zeros(1, 2))
    return guide


def _check_pyro_stack():
    with pyro.poutine.trace(param_only=True) as capture:
        assert len(_internals.param_captures()[0]) == 1 and _internals.active_param_trace() is capture


def _check_param_store():
    pyro.param("internals_check", torch.ones(2), constraint=dist.constraints.positive)
    [value] = _internals.ParamReader(["internals_check"]).read([])
    assert torch.equal(value, pyro.param("internals_check")) and value.unconstrained() is not None


def _check_pyro_module_context():
    layer = BayesianLinear(2, 1)
    with _internals.preset_samples(layer, {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}) as read:
        assert layer(torch.ones(3, 2)).squeeze(-1).tolist() == [2.0, 2.0, 2.0]
    assert read == {"weight", "bias"}
    fresh = pyro.nn.PyroModule[torch.nn.Sequential](BayesianLinear(2, 1))
    assert not _internals.pyro_module_has_run(fresh)
    fresh(torch.ones(1, 2))
    assert _internals.pyro_module_has_run(fresh)
    parent = pyro.nn.PyroModule()
    with pytest.raises(AssertionError):  # what the adapter's answer spares a user: Pyro's refusal of such a module
        parent.child = fresh
    lone = BayesianLinear(2, 1)
    lone(torch.ones(1, 2))
    assert not _internals.pyro_module_has_run(lone)  # a lone layer that has run Pyro renames and takes
    parent.lone = lone


def _check_pyro_module_samples():
    net = pyro.nn.PyroModule[torch.nn.Sequential](BayesianLinear(2, 3))
    assert set(_internals.sample_priors(net)) >= {"0.weight", "0.bias"}


def _check_autonormal_hooks():
    guide = _internals.AutoNormalHooks(BayesianLinear(2, 1))
    guide.set_up(torch.zeros(1, 2))
    assert guide.event_dim("weight") == 2 and guide.has_site("bias") and guide.site_names() == ["weight", "bias"]
    assert set(guide.plates_for_call(torch.zeros(1, 2))) == set() and guide.module_name == "AutoNormalHooks"
    loc, scale = guide.loc_and_scale("weight")
    assert loc.shape == scale.shape == (1, 2)


def _check_elbo_hooks():
    """pyro_bbb.ELBO overrides TraceMeanField_ELBO's three hooks under Pyro's names: Pyro must still call them."""
    calls = []

    class Recording(TraceMeanField_ELBO):
        def _get_trace(self, *args):
            calls.append("_get_trace")
            return super()._get_trace(*args)

        def _get_traces(self, *args):
            calls.append("_get_traces")
            return super()._get_traces(*args)

        def _differentiable_loss_particle(self, model_trace, guide_trace):
            calls.append("_differentiable_loss_particle")
            return super()._differentiable_loss_particle(model_trace, guide_trace)

    def model():
        pyro.sample("z", dist.Normal(0.0, 1.0))

    def guide():
        pyro.sample("z", dist.Normal(1.0, 1.0))

    assert Recording().loss(model, guide) == pytest.approx(0.5)
    assert calls == ["_get_traces", "_get_trace", "_differentiable_loss_particle"]
    assert callable(_internals.vectorized_model(Recording(num_particles=2, vectorize_particles=True), model))


def _check_deterministic_flag():
    def model():
        pyro.deterministic("d", torch.ones(1))

    assert _internals.is_deterministic_site(pyro.poutine.trace(model).get_trace().nodes["d"])


def _check_fused_adam():
    p = torch.ones(2, requires_grad=True)
    p.grad = torch.ones(2)
    reference = torch.optim.Adam([q := p.detach().clone().requires_grad_()], lr=0.1, fused=True)
    q.grad = torch.ones(2)
    reference.step()
    group = {"lr": 0.1, "betas": (0.9, 0.999), "weight_decay": 0.0, "eps": 1e-8}
    _internals.fused_adam_step([p], [torch.zeros(2)], [torch.zeros(2)], [torch.zeros(())], group)
    assert torch.equal(p.detach(), q.detach())


def _check_step_hooks():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    assert not _internals.optimizer_has_step_hooks(optimizer)
    handle = optimizer.register_step_pre_hook(lambda *args: None)
    assert _internals.optimizer_has_step_hooks(optimizer)
    handle.remove()


def _check_recurrent_kernels():
    lstm = torch.nn.LSTM(3, 4)
    x = torch.randn(5, 2, 3)
    hx = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    output, *_ = _internals.recurrent_kernel("LSTM")(x, hx, list(lstm.parameters()), True, 1, 0.0, False, False,
                                                     False)
    torch.testing.assert_close(output, lstm(x)[0])
    assert _internals.recurrent_kernel("GRU") is torch.gru


def _check_pyro_optimizer_state():
    p = torch.zeros(2, requires_grad=True)
    optimizer = pyro.optim.ExponentialLR({"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.1}, "gamma": 0.5})
    p.grad = torch.ones(2)
    optimizer([p])
    optimizer.step()
    state = _internals.PyroOptimizerState(optimizer)
    for _ in range(2):
        p.grad = torch.ones(2)
        optimizer([p])
        optimizer.step()
    state.restore()
    scheduler = optimizer.optim_objs[p]
    assert int(scheduler.optimizer.state[p]["step"]) == 1 and scheduler.last_epoch == 1
    assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


CHECKS = {
    "pyro.nn.module._make_name": lambda: _internals.site_name("net.0", "weight") == "net.0.weight",
    "pyro.nn.module._is_module_local_param_enabled": lambda: _internals.module_local_params_enabled() is False,
    "pyro.infer.trace_mean_field_elbo._check_mean_field_requirement": lambda: (
        _internals.check_mean_field_requirement(pyro.poutine.Trace(), pyro.poutine.Trace()) is None),
    "pyro.poutine.runtime._PYRO_STACK": _check_pyro_stack,
    "ParamStoreDict._params / _constraints": _check_param_store,
    "PyroModule._pyro_context": _check_pyro_module_context,
    "PyroModule._pyro_samples": _check_pyro_module_samples,
    "PyroModule._pyro_name": lambda: _internals.pyro_name(pyro.nn.PyroModule[torch.nn.Sequential](
        pyro.nn.PyroModule[torch.nn.Linear](2, 1))[0]) == "0",
    "AutoNormal._setup_prototype / _get_loc_and_scale / _event_dims / _create_plates / _pyro_name":
        _check_autonormal_hooks,
    "AutoNormal._get_loc_and_scale (a plain AutoNormal)": lambda: (
        _internals.autonormal_loc_and_scale(_autonormal(), "bias")[1].item() == pytest.approx(0.1)),
    "AutoNormal._event_dims (a plain AutoNormal)": lambda: (
        _internals.autonormal_event_dim(_autonormal(), "weight") == 2),
    "AutoGuide._setup_prototype (a plain AutoNormal)": lambda: _internals.set_up_autoguide(
        AutoNormal(BayesianLinear(2, 1)), torch.zeros(1, 2)) is None,
    "TraceMeanField_ELBO._get_trace / _get_traces / _differentiable_loss_particle / _vectorized_num_particles":
        _check_elbo_hooks,
    'msg["infer"]["_deterministic"]': _check_deterministic_flag,
    "torch._C._get_tracing_state": lambda: _internals.is_tracing() is False,
    "Tensor._version": lambda: _internals.tensor_version(torch.zeros(1).add_(1)) == 1,
    "nn.Module._buffers": lambda: torch.equal(_internals.module_buffer(torch.nn.BatchNorm1d(2), "running_mean"),
                                              torch.zeros(2)),
    "torch._foreach_norm": lambda: [float(n) for n in _internals.foreach_norm([torch.ones(4)])] == [2.0],
    "torch._foreach_copy_": lambda: _internals.foreach_copy_([torch.zeros(1)], [torch.ones(1)]) is None,
    "torch._amp_foreach_non_finite_check_and_unscale_": lambda: (
        not _internals.all_finite([torch.tensor([1.0, float("nan")])]) and _internals.all_finite([torch.ones(2)])),
    "torch._foreach_add_ / torch._fused_adam_": _check_fused_adam,
    "Optimizer._optimizer_step_pre_hooks / _global_optimizer_pre_hooks": _check_step_hooks,
    "torch.lstm / torch.gru (positional)": _check_recurrent_kernels,
    "pyro.optim.optim._get_state_dict / _load_state_dict (a scheduler's too)": _check_pyro_optimizer_state,
    "pyro.poutine.messenger._bound_partial (a handler's wrapper)": lambda: (
        _internals.unwrap_handlers(pyro.poutine.scale(_autonormal, 0.5)) is _autonormal
        and _internals.unwrap_handlers(AutoNormal(_autonormal).model) is _autonormal),
    "torch.nn.modules.conv._ConvNd / _ConvTransposeNd": lambda: (
        isinstance(torch.nn.Conv2d(1, 1, 1), _internals.ConvNd)
        and isinstance(torch.nn.ConvTranspose1d(1, 1, 1), _internals.ConvTransposeNd)),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_private_name_still_works(name):
    try:
        result = CHECKS[name]()
    except Exception as error:  # noqa: BLE001 (any failure means the private name moved or changed)
        pytest.fail(f"{name} moved or changed in this release; pyro_bbb._internals was checked on "
                    f"{_internals.CHECKED_ON}: {error!r}")
    assert result is not False, (f"{name} behaves differently in this release; pyro_bbb._internals was checked on "
                                 f"{_internals.CHECKED_ON}")


def test_the_checked_versions_are_the_installed_ones_or_newer():
    """CHECKED_ON names real releases; a newer install is what the checks above are for."""
    for package, version in _internals.CHECKED_ON.items():
        installed = importlib.metadata.version(package).split("+")[0]
        assert tuple(map(int, installed.split(".")[:2])) >= tuple(map(int, version.split(".")[:2])), package


def test_every_private_access_of_the_package_is_in_the_adapter():
    """No module but ``_internals`` (and the replay module it serves) reaches a private Pyro or torch name -- except
    the ELBO's three overrides of ``TraceMeanField_ELBO``'s hooks, under Pyro's own names as Pyro's own subclasses
    do (``_check_elbo_hooks`` above checks that Pyro still calls them)."""
    import re
    from pathlib import Path

    root = Path(_internals.__file__).parent
    pattern = re.compile(r"torch\._[a-z]|(?<=[\w)\]])\._(pyro_name|pyro_context|pyro_samples|setup_prototype|"
                         r"get_loc_and_scale|event_dims|get_traces?|differentiable_loss_particle|"
                         r"vectorized_num_particles|create_plates|buffers|version|params|constraints)\b|_PYRO_STACK|"
                         r"\"_deterministic\"")
    offenders = []
    for path in root.rglob("*.py"):
        if path.name in ("_internals.py", "_replay.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if path.relative_to(root).as_posix() == "infer/elbo.py":
                code = re.sub(r"\._(get_traces?|differentiable_loss_particle)\(", "(", code)
            if pattern.search(code) and not code.lstrip().startswith(("\"", "'", ">>>")):
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_module_hooks_reads_each_kind_torch_keeps():
    layer = torch.nn.Linear(2, 1)
    assert _internals.module_hooks(layer) == []
    layer.register_forward_hook(lambda module, inputs, output: output)
    layer.register_forward_pre_hook(lambda module, inputs: inputs)
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: None)
    layer.register_full_backward_pre_hook(lambda module, grad_output: None)
    assert _internals.module_hooks(layer) == ["forward_hooks", "forward_pre_hooks", "backward_hooks",
                                              "backward_pre_hooks"]

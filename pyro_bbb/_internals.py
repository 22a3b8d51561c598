"""Every private Pyro and torch name pyro_bbb uses, each behind one function or class of this module: a release
that moves one breaks this module (and ``tests/test_internals.py`` names which), nothing else.

Checked on the versions in :data:`CHECKED_ON`.

Examples
--------
>>> site_name("net.0", "weight")
'net.0.weight'
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pyro
import torch
import torch.optim.optimizer as optimizer_module
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.infer.trace_mean_field_elbo import _check_mean_field_requirement
from pyro.nn.module import _is_module_local_param_enabled, _make_name
from pyro.optim.optim import _get_state_dict, _load_state_dict
from pyro.poutine.messenger import Messenger, _bound_partial
from pyro.poutine.replay_messenger import ReplayMessenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.scale_messenger import ScaleMessenger
from pyro.poutine.trace_messenger import TraceMessenger
from torch.distributions import transform_to
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd

__all__ = [
    "CHECKED_ON", "site_name", "pyro_name", "module_local_params_enabled", "check_mean_field_requirement",
    "autonormal_loc_and_scale", "set_up_autoguide", "autonormal_event_dim", "param_captures", "ParamReader",
    "preset_samples", "sample_priors", "is_deterministic_site", "AutoNormalHooks", "vectorized_model",
    "active_param_trace", "queue_after_backward", "current_backward_id", "unconstrained_param",
    "pyro_module_has_run",
    "is_tracing", "tensor_version", "module_buffer", "foreach_norm", "foreach_copy_", "all_finite",
    "fused_adam_step", "optimizer_has_step_hooks", "recurrent_kernel", "ConvNd", "ConvTransposeNd", "BatchNormNd",
    "without_trace_shapes", "active_messengers", "active_scales", "active_handlers_of", "replayed_for_gradients",
    "PyroOptimizerState", "module_hooks", "sampled_attributes", "unwrap_handlers", "wrap_in", "pyro_module_context",
]

#: The releases every access below was checked on.
CHECKED_ON = {"torch": "2.13.0", "pyro-ppl": "1.9.2"}

#: torch's base classes of the (transposed) convolution modules.
ConvNd = _ConvNd
ConvTransposeNd = _ConvTransposeNd
#: torch's base class of the batch norm modules.
BatchNormNd = _BatchNorm


def site_name(prefix: str, name: str) -> str:
    """The Pyro site (or parameter) name of attribute ``name`` of a ``PyroModule`` named ``prefix``.

    Examples
    --------
    >>> site_name("", "weight")
    'weight'
    """
    return _make_name(prefix, name)


def module_local_params_enabled() -> bool:
    """Whether ``pyro.settings`` keeps ``PyroModule`` parameters local to the module (not in the global store).

    Examples
    --------
    >>> module_local_params_enabled()
    False
    """
    return _is_module_local_param_enabled()


def check_mean_field_requirement(model_trace: Any, guide_trace: Any) -> None:
    """Pyro's warning for guides whose sites are not in the model's order (what ``TraceMeanField_ELBO`` checks).

    Examples
    --------
    ::

        check_mean_field_requirement(model_trace, guide_trace)
    """
    _check_mean_field_requirement(model_trace, guide_trace)


def autonormal_loc_and_scale(guide: Any, name: str):
    """The live ``(loc, scale)`` of Pyro's ``AutoNormal`` at site ``name`` (its private accessor).

    Examples
    --------
    ::

        loc, scale = autonormal_loc_and_scale(AutoNormal(model), "fc.weight")
    """
    return guide._get_loc_and_scale(name)


def autonormal_draw_site(guide_trace: Any, name: str) -> dict[str, Any] | None:
    """The auxiliary site through which Pyro's ``AutoNormal`` draws site ``name`` (a ``Normal`` in unconstrained
    space, at ``<name>_unconstrained``), or ``None`` when the guide trace has none.

    Examples
    --------
    >>> guide = pyro.infer.autoguide.AutoNormal(pyro_bbb.nn.BayesianLinear(2, 1))
    >>> trace = pyro.poutine.trace(guide).get_trace(torch.zeros(1, 2))
    >>> type(autonormal_draw_site(trace, "weight")["fn"].base_dist).__name__
    'Normal'
    """
    site = guide_trace.nodes.get(f"{name}_unconstrained")
    return site if site is not None and site["type"] == "sample" and site["infer"].get("is_auxiliary") else None


def set_up_autoguide(guide: Any, *args: Any, **kwargs: Any) -> None:
    """Create an autoguide's parameters from one run of its model on ``args`` (no draw from the guide), as its
    first call would.

    Examples
    --------
    ::

        set_up_autoguide(guide, x_first, y_first)   # e.g. before broadcasting the parameters to other ranks
    """
    guide._setup_prototype(*args, **kwargs)


def autonormal_event_dim(guide: Any, name: str) -> int:
    """How many rightmost dimensions of site ``name`` an ``AutoNormal`` treats as one event.

    Examples
    --------
    ::

        normal = dist.Normal(loc, scale).to_event(autonormal_event_dim(guide, "fc.weight"))
    """
    return guide._event_dims[name]


def active_param_trace() -> Any:
    """The innermost active ``poutine.trace(param_only=True)`` handler (``SVI.step`` and ``fit`` open one around each
    step to learn which parameters it used), or ``None``.

    Examples
    --------
    >>> active_param_trace() is None
    True
    >>> with pyro.poutine.trace(param_only=True) as capture:
    ...     active_param_trace() is capture
    True
    """
    for messenger in reversed(_PYRO_STACK):
        if type(messenger) is TraceMessenger and messenger.param_only:
            return messenger
    return None


def pyro_module_has_run(module: Any) -> bool:
    """Whether Pyro would refuse to make ``module`` a submodule of another (an ``AssertionError``): a
    :class:`~pyro.nn.PyroModule` whose Pyro submodules have run as parts of it on its own, their sites named without
    the new parent's prefix. (A lone layer that has run is renamed by Pyro and taken.)

    Examples
    --------
    >>> from pyro.nn import PyroModule
    >>> net = PyroModule[torch.nn.Sequential](PyroModule[torch.nn.Linear](2, 1))
    >>> pyro_module_has_run(net), pyro_module_has_run((net(torch.zeros(1, 2)), net)[1])
    (False, True)
    """
    if not isinstance(module, pyro.nn.PyroModule):
        return False
    return any(isinstance(part, pyro.nn.PyroModule) and bool(getattr(part._pyro_context, "used", False))
               for part in module.modules() if part is not module)


def unconstrained_param(value: torch.Tensor) -> torch.Tensor:
    """The leaf tensor an optimizer updates for a param site's value: the ``unconstrained()`` back-reference Pyro
    gives a param-store value, or the value itself -- a module's own ``nn.Parameter`` under
    ``pyro.settings.set(module_local_params=True)``, which has none.

    Examples
    --------
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> unconstrained_param(p) is p
    True
    """
    back_reference = getattr(value, "unconstrained", None)
    return value if back_reference is None else back_reference()


def param_captures(allowed: tuple[type, ...] = ()) -> tuple[list, list] | None:
    """The traces of the active ``poutine.trace(param_only=True)`` handlers (how ``SVI.step`` and ``fit`` learn which
    parameters a step used) and the active handlers of the ``allowed`` types, when nothing else is active; ``None``
    when any other handler is.

    Examples
    --------
    >>> param_captures()
    ([], [])
    >>> with pyro.poutine.trace(param_only=True):
    ...     len(param_captures()[0])
    1
    >>> with pyro.poutine.block():
    ...     param_captures() is None
    True
    """
    captures, others = [], []
    for messenger in _PYRO_STACK:
        if type(messenger) is TraceMessenger and messenger.param_only:
            captures.append(messenger.trace)
        elif type(messenger) in allowed:
            others.append(messenger)
        else:
            return None
    return captures, others


class ParamReader:
    """Reads named parameters of Pyro's param store in their constrained form, as ``pyro.param(name)`` returns them
    (the same tensors, with the ``unconstrained`` back-reference the optimizers follow), without a message per
    parameter; :meth:`read` also records them in the given ``param_only`` traces, as the messages would have.

    Examples
    --------
    >>> _ = pyro.param("reader_example", torch.ones(2), constraint=pyro.distributions.constraints.positive)
    >>> reader = ParamReader(["reader_example"])
    >>> [value] = reader.read([])
    >>> torch.equal(value, pyro.param("reader_example")), value.unconstrained() is not None
    (True, True)
    """

    def __init__(self, names: list[str]):
        self.names = list(names)
        self._transforms: dict[str, Any] = {}

    def read(self, captures: list, start: int = 0, stop: int | None = None) -> list[torch.Tensor]:
        """The values of ``names[start:stop]``, recorded in ``captures``."""
        store = pyro.get_param_store()
        values = []
        for name in self.names[start:stop]:
            unconstrained = store._params[name]
            transform = self._transforms.get(name)
            if transform is None or transform[0] is not store._constraints[name]:
                transform = self._transforms[name] = (store._constraints[name], transform_to(store._constraints[name]))
            value = transform[1](unconstrained)
            value.unconstrained = weakref.ref(unconstrained)
            for trace in captures:
                trace.add_node(name, type="param", name=name, value=value, args=(), kwargs={}, infer={},
                               scale=1.0, mask=None, cond_indep_stack=(), done=True, stop=False, continuation=None,
                               is_observed=False, fn=None)
            values.append(value)
        return values


class _ReadNames(dict):
    """A ``PyroModule`` context cache that remembers which names were read."""

    def __init__(self, values: dict[str, torch.Tensor]):
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, name, default=None):
        if name in self:
            self.read.add(name)
        return super().get(name, default)


@contextmanager
def preset_samples(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> Iterator[set[str]]:
    """Within the block, ``module``'s ``PyroSample`` attributes named in ``values`` (by full site name) return those
    values without a ``pyro.sample`` message -- the cache ``PyroModule`` keeps for one model run, filled up front.
    Yields the set of the names read so far (filled as the block runs).

    Examples
    --------
    >>> from pyro_bbb.nn import BayesianLinear
    >>> layer = BayesianLinear(2, 1)
    >>> with preset_samples(layer, {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}) as read:
    ...     output = layer(torch.ones(3, 2))
    >>> output.squeeze(-1), sorted(read)
    (tensor([2., 2., 2.]), ['bias', 'weight'])
    """
    context = module._pyro_context
    context.__enter__()
    saved, context.cache = context.cache, _ReadNames(values)
    try:
        yield context.cache.read
    finally:
        context.cache = saved
        context.__exit__(None, None, None)


def _emitted_prior(module: torch.nn.Module, prior: Any):
    return prior if hasattr(prior, "sample") else prior(module)


def module_hooks(module: torch.nn.Module) -> list[str]:
    """The kinds of hook registered on ``module`` itself (``"forward_hooks"``, ``"forward_pre_hooks"``, ...; torch
    keeps each kind in a private dict of the module), ``[]`` for none.

    Examples
    --------
    >>> layer = torch.nn.Linear(2, 1)
    >>> _ = layer.register_forward_hook(lambda module, inputs, output: output)
    >>> module_hooks(layer), module_hooks(torch.nn.Linear(2, 1))
    (['forward_hooks'], [])
    """
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return [kind.strip("_") for kind in kinds if getattr(module, kind, None)]


def sampled_attributes(module: torch.nn.Module) -> list[str]:
    """The names of ``module``'s own attributes that are ``PyroSample`` sites (``[]`` for a plain module).

    Examples
    --------
    >>> from pyro.nn import PyroModule, PyroSample
    >>> layer = PyroModule[torch.nn.Linear](2, 1)
    >>> layer.weight = PyroSample(pyro.distributions.Normal(0.0, 1.0).expand([1, 2]).to_event(2))
    >>> sampled_attributes(layer), sampled_attributes(torch.nn.Linear(2, 1))
    (['weight'], [])
    """
    return list(module.__dict__.get("_pyro_samples") or {})


def sample_priors(model: torch.nn.Module) -> dict[str, Callable[[], Any]]:
    """Site name -> a function returning the prior that a ``PyroModule``'s ``PyroSample`` attribute emits at that
    moment (a callable prior is called with its module, as ``PyroModule`` does), for every such attribute in
    ``model``.

    Examples
    --------
    >>> from pyro_bbb import BNN, likelihoods
    >>> from pyro_bbb.nn import BayesianLinear
    >>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian())   # a learned (latent) noise scale
    >>> type(sample_priors(bnn)["likelihood.scale"]()).__name__
    'LogNormal'
    """
    found = {}
    for module in model.modules():
        prefix = pyro_name(module)
        for attr in sampled_attributes(module):
            found[site_name(prefix, attr)] = partial(_emitted_prior, module, module._pyro_samples[attr])
    return found


def pyro_name(module: torch.nn.Module) -> str:
    """The name a ``PyroModule`` gives its sites' prefix (``""`` for the root or a plain module).

    Examples
    --------
    >>> from pyro.nn import PyroModule
    >>> net = PyroModule[torch.nn.Sequential](PyroModule[torch.nn.Linear](2, 1))
    >>> pyro_name(net[0]), pyro_name(net)
    ('0', '')
    """
    return module.__dict__.get("_pyro_name", "")


def is_deterministic_site(msg: dict[str, Any]) -> bool:
    """Whether a sample message is a ``pyro.deterministic`` site (Pyro marks them in ``infer``).

    Examples
    --------
    >>> def model():
    ...     pyro.deterministic("d", torch.ones(1))
    >>> is_deterministic_site(pyro.poutine.trace(model).get_trace().nodes["d"])
    True
    """
    return bool(msg["infer"].get("_deterministic"))


class AutoNormalHooks(AutoNormal):
    """Pyro's :class:`~pyro.infer.autoguide.AutoNormal` with the private hooks a subclass builds on given public
    names: :meth:`after_set_up` runs after the prototype is made, :meth:`loc_and_scale` answers every read of a
    site's ``(loc, scale)``; :meth:`set_up`, :meth:`event_dim`, :meth:`has_site`, :meth:`plates_for_call` and
    :attr:`module_name` read what AutoNormal keeps privately.

    Examples
    --------
    >>> guide = AutoNormalHooks(pyro_bbb.nn.BayesianLinear(2, 1))
    >>> guide.set_up(torch.zeros(1, 2))
    >>> guide.event_dim("weight"), guide.has_site("bias"), guide.has_site("scale")
    (2, True, False)
    """

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        AutoNormal._setup_prototype(self, *args, **kwargs)
        self.after_set_up()

    def _get_loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.loc_and_scale(name)

    def after_set_up(self) -> None:
        """Called once the guide's prototype trace and parameters exist (nothing by default)."""

    def loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The (constrained) ``(loc, scale)`` of site ``name``; AutoNormal's own lookup by default."""
        return self.autonormal_loc_and_scale(name)

    def autonormal_loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """AutoNormal's own lookup of site ``name``'s ``(loc, scale)`` (nested ``PyroModule`` attributes)."""
        return AutoNormal._get_loc_and_scale(self, name)

    def set_up(self, *args: Any, **kwargs: Any) -> None:
        """Make the prototype trace and the parameters from one run of the model on ``args``."""
        self._setup_prototype(*args, **kwargs)

    def event_dim(self, name: str) -> int:
        """How many rightmost dimensions of site ``name`` form one event."""
        return self._event_dims[name]

    def has_site(self, name: str) -> bool:
        """Whether the guide has a posterior for latent site ``name``."""
        return name in self._event_dims

    def site_names(self) -> list[str]:
        """The latent sites the guide has posteriors for, in the model's order."""
        return list(self._event_dims)

    def plates_for_call(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The guide's plates for a call with ``args`` (AutoGuide's ``create_plates``), by name."""
        return self._create_plates(*args, **kwargs)

    @property
    def module_name(self) -> str:
        """The guide's ``PyroModule`` name: the prefix of its parameters' names in Pyro's param store."""
        return self._pyro_name


def vectorized_model(elbo: TraceMeanField_ELBO, model: Callable) -> Callable:
    """``model`` under the particle plate Pyro's ELBO adds for ``vectorize_particles=True``.

    Examples
    --------
    >>> elbo = TraceMeanField_ELBO(num_particles=2, vectorize_particles=True)
    >>> callable(vectorized_model(elbo, lambda: None))
    True
    """
    return elbo._vectorized_num_particles(model)


def replayed_for_gradients() -> bool:
    """Whether the model running now is replayed against a guide's trace inside a full ``poutine.trace`` with
    gradients on: how every Pyro ELBO (``Trace_ELBO``, ``TraceMeanField_ELBO``, ``TraceGraph_ELBO``, ``RenyiELBO``,
    the ``JitTrace*`` ones, through ``get_importance_trace``) runs a model for a training step, unlike ``Predictive``
    (``poutine.condition``) or a replay for a checkpoint (a parameter-only trace, no gradients).

    Examples
    --------
    >>> replayed_for_gradients()
    False
    >>> with pyro.poutine.trace(), pyro.poutine.replay(trace=pyro.poutine.Trace()):
    ...     replayed_for_gradients()
    True
    """
    if not torch.is_grad_enabled() or not active_messengers(ReplayMessenger):
        return False
    return any(type(m) is TraceMessenger and not m.param_only for m in _PYRO_STACK)


def is_tracing() -> bool:
    """Whether ``torch.jit.trace`` is recording (a loss must then stay a tensor).

    Examples
    --------
    >>> is_tracing()
    False
    """
    return bool(torch._C._get_tracing_state())


def tensor_version(tensor: torch.Tensor) -> int:
    """torch's counter of in-place changes to ``tensor`` (a cache key that notices ``copy_``).

    Examples
    --------
    >>> t = torch.zeros(2)
    >>> before = tensor_version(t)
    >>> _ = t.add_(1)
    >>> tensor_version(t) > before
    True
    """
    return tensor._version


def queue_after_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the backward pass now running has finished (called from a tensor hook inside it): the
    gradients it accumulates are then in every parameter's ``.grad``.

    Examples
    --------
    >>> p = torch.ones(2, requires_grad=True)
    >>> seen = []
    >>> loss = (3 * p).sum()
    >>> _ = loss.register_hook(lambda g: queue_after_backward(lambda: seen.append(p.grad.clone())))
    >>> loss.backward()
    >>> seen
    [tensor([3., 3.])]
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def current_backward_id() -> int:
    """An id of the backward pass now running (a new one for every pass; -1 outside one).

    Examples
    --------
    >>> current_backward_id()
    -1
    """
    return torch._C._current_graph_task_id()


def module_buffer(module: torch.nn.Module, name: str) -> torch.Tensor:
    """Buffer ``name`` of ``module`` itself, without ``PyroModule``'s attribute lookup.

    Examples
    --------
    >>> module = torch.nn.Module()
    >>> module.register_buffer("b", torch.ones(1))
    >>> module_buffer(module, "b")
    tensor([1.])
    """
    return module._buffers[name]


def foreach_norm(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The 2-norm of every tensor, in one call.

    Examples
    --------
    >>> [float(n) for n in foreach_norm([torch.ones(4), torch.zeros(2)])]
    [2.0, 0.0]
    """
    return torch._foreach_norm(tensors)


def foreach_copy_(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target.copy_(source)`` for every pair, in one call.

    Examples
    --------
    >>> a = [torch.zeros(2)]
    >>> foreach_copy_(a, [torch.ones(2)])
    >>> a[0]
    tensor([1., 1.])
    """
    torch._foreach_copy_(targets, sources)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite, with one device sync: torch's AMP check (one kernel over all
    tensors; it multiplies them by exactly 1) where it runs, else one sum per tensor.

    Examples
    --------
    >>> all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    False
    """
    if not tensors:
        return True
    device = tensors[0].device
    if all(t.device == device and not t.is_sparse for t in tensors):
        found = torch.zeros(1, device=device)
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, torch.ones(1, device=device))
            return not bool(found.item())
        except (RuntimeError, NotImplementedError, AttributeError):  # a torch or dtype without it
            pass
    return bool(torch.stack([t.sum() for t in tensors]).isfinite().all())


def fused_adam_step(params: list[torch.Tensor], exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                    steps: list[torch.Tensor], group: dict[str, Any]) -> None:
    """One step of torch's fused Adam kernel, as ``torch.optim.Adam(fused=True).step()`` calls it for a param group
    of plain settings: the step counts advance, then every parameter moves by its gradient.

    Examples
    --------
    >>> p = torch.ones(2, requires_grad=True)
    >>> p.grad = torch.ones(2)
    >>> group = {"lr": 0.1, "betas": (0.9, 0.999), "weight_decay": 0.0, "eps": 1e-8}
    >>> fused_adam_step([p], [torch.zeros(2)], [torch.zeros(2)], [torch.zeros(())], group)
    >>> p.detach()
    tensor([0.9000, 0.9000])
    """
    torch._foreach_add_(steps, 1)
    with torch.no_grad():
        torch._fused_adam_(params, [p.grad for p in params], exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                           lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                           weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, grad_scale=None,
                           found_inf=None)


def optimizer_has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether step hooks are registered (on this optimizer or globally): they run only through ``step()``.
    Unknown (a torch that keeps them elsewhere) counts as yes.

    Examples
    --------
    >>> optimizer_has_step_hooks(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
    False
    """
    hook_lists = (getattr(optimizer, "_optimizer_step_pre_hooks", None),
                  getattr(optimizer, "_optimizer_step_post_hooks", None),
                  getattr(optimizer_module, "_global_optimizer_pre_hooks", None),
                  getattr(optimizer_module, "_global_optimizer_post_hooks", None))
    return any(hooks is None or len(hooks) > 0 for hooks in hook_lists)


class PyroOptimizerState:
    """A Pyro optimizer's per-parameter torch optimizers (their schedulers, gradient clippers) and a copy of their
    states as they are now, keyed by the parameter itself, to put back with :meth:`restore`. Pyro's own
    ``get_state`` / ``set_state`` key them by the param store's names, which module-local parameters
    (``pyro.settings.set(module_local_params=True)``) do not have: every one would be keyed ``None``, and the next step
    would load one parameter's state into another's optimizer.

    Examples
    --------
    >>> p = torch.zeros(2, requires_grad=True)
    >>> optimizer = pyro.optim.Adam({"lr": 0.1})
    >>> p.grad = torch.ones(2)
    >>> optimizer([p])
    >>> state = PyroOptimizerState(optimizer)
    >>> p.grad = torch.ones(2)
    >>> optimizer([p])
    >>> state.restore()
    >>> int(optimizer.optim_objs[p].state[p]["step"])
    1
    """

    def __init__(self, optimizer: Any):
        self.optimizer = optimizer
        self.objects, self.grad_clip = dict(optimizer.optim_objs), dict(optimizer.grad_clip)
        self.states = {param: copy.deepcopy(_get_state_dict(obj)) for param, obj in self.objects.items()}

    def restore(self) -> None:
        """Put back the optimizers (a parameter first stepped since starts afresh) and their states (copies: the
        same snapshot can be restored again)."""
        self.optimizer.optim_objs.clear()
        self.optimizer.optim_objs.update(self.objects)
        self.optimizer.grad_clip.clear()
        self.optimizer.grad_clip.update(self.grad_clip)
        for param, obj in self.objects.items():
            _load_state_dict(obj, copy.deepcopy(self.states[param]))


def recurrent_kernel(mode: str) -> Callable:
    """torch's whole-sequence kernel of an ``"LSTM"`` or ``"GRU"``, the op ``torch.nn.LSTM.forward`` calls after
    its checks: ``op(input, hx, flat_weights, has_biases, num_layers, dropout, training, bidirectional,
    batch_first) -> (output, *state)``.

    Examples
    --------
    >>> recurrent_kernel("GRU") is torch.gru
    True
    """
    return {"LSTM": torch.lstm, "GRU": torch.gru}[mode]


@contextmanager
def without_trace_shapes() -> Iterator[None]:
    """Within the block, an error raised inside a traced Pyro model reaches the caller once, as it was raised: Pyro's
    trace re-raises every ``ValueError`` / ``RuntimeError`` as a new one with its shape table appended (once per
    nested trace), which buries a clear message under dozens of lines.

    Examples
    --------
    >>> def model():
    ...     pyro.sample("z", pyro.distributions.Normal(0.0, 1.0))
    ...     raise ValueError("a clear message")
    >>> try:
    ...     with without_trace_shapes():
    ...         pyro.poutine.trace(model).get_trace()
    ... except ValueError as error:
    ...     print(error)
    a clear message
    """
    try:
        yield
    except (ValueError, RuntimeError) as error:
        root = error
        while "Trace Shapes:" in str(root) and type(root.__cause__) is type(root):
            root = root.__cause__
        if root is error:
            raise
        raise root.with_traceback(root.__traceback__) from None


def active_messengers(kind: type) -> list:
    """The handlers of type ``kind`` active now (on Pyro's effect stack), outermost first.

    Examples
    --------
    >>> with pyro.poutine.block() as block:
    ...     active_messengers(pyro.poutine.block_messenger.BlockMessenger) == [block]
    True
    """
    return [messenger for messenger in _PYRO_STACK if isinstance(messenger, kind)]


def active_handlers_of(effect: str) -> tuple:
    """The handlers active now (outermost first) that handle Pyro messages of type ``effect`` (a ``_pyro_<effect>``
    method): what an effectful operation's result depends on.

    Examples
    --------
    >>> with pyro.poutine.block():
    ...     active_handlers_of("sample")
    ()
    """
    return tuple(m for m in _PYRO_STACK if callable(getattr(m, f"_pyro_{effect}", None)))


def active_scales() -> list:
    """The ``scale`` of every ``poutine.scale`` active now (a number or a tensor), outermost first.

    Examples
    --------
    >>> with pyro.poutine.scale(scale=4.0):
    ...     active_scales()
    [4.0]
    """
    return [messenger.scale for messenger in active_messengers(ScaleMessenger)]


def pyro_module_context(module: torch.nn.Module):
    """The context a ``PyroModule`` enters around its own call (its sites cached for one run, its ``PyroSample``
    attributes sampled rather than drawn from their prior): for a method of the module called from outside.

    Examples
    --------
    >>> from pyro.nn import PyroModule
    >>> module = PyroModule()
    >>> with pyro_module_context(module):
    ...     pass
    """
    return module._pyro_context


def wrap_in(messenger: Messenger, run: Callable, fn: Callable) -> Callable:
    """``fn`` wrapped as Pyro wraps a function in a handler (``handler(fn)``), run by ``run(messenger, fn, *args,
    **kwargs)`` instead of Pyro's own context wrapper: :func:`unwrap_handlers` reads it as Pyro's.

    Examples
    --------
    >>> wrapped = wrap_in(pyro.poutine.block(), lambda handler, fn, x: fn(x) + 1, abs)
    >>> wrapped(-2), unwrap_handlers(wrapped) is abs
    (3, True)
    """
    return _bound_partial(partial(run, messenger, fn))


def unwrap_handlers(fn: Callable) -> Callable:
    """The function inside Pyro's effect handlers: ``poutine.scale(model, 0.5)`` or an autoguide's init strategy
    wrap a model in a private partial object (Pyro's own ``unwrap`` reads any partial with two arguments as one).

    Examples
    --------
    >>> def model():
    ...     pass
    >>> unwrap_handlers(pyro.poutine.scale(pyro.poutine.block(model), 0.5)) is model
    True
    """
    while (isinstance(fn, _bound_partial) and isinstance(fn.func, partial) and len(fn.func.args) == 2
           and isinstance(fn.func.args[0], Messenger)):
        fn = fn.func.args[1]
    return fn

"""``BNN``: a network and a likelihood joined into a Pyro model, weights outside the data plate."""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro.nn import PyroModule
from pyro.nn import module as pyro_module
from pyro.nn.module import to_pyro_module_
from pyro.poutine.runtime import get_plates

from ._checks import check_count
from ._draws import batch_rows, fold_draws, output_batch
from ._inputs import Inputs, map_inputs, num_rows
from ._internals import (
    active_scales,
    module_buffer,
    pyro_module_context,
    pyro_module_has_run,
    replayed_for_gradients,
)
from ._plates import DATA_PLATE, active_data_plate_scalers, data_plate_named
from ._warnings import warn_at_caller
from .likelihoods import Likelihood
from .nn.moments import Moments

__all__ = ["BNN", "net_output", "call_net"]


def net_output(output: Any) -> torch.Tensor:
    """The default output adapter of :class:`BNN`: the tensor a net's output holds for the likelihood.

    A tensor is returned as it is; an object or mapping with ``logits`` (a transformers ``ModelOutput`` such as
    ``SequenceClassifierOutput``) gives its logits; a tuple or list gives its first element (``nn.LSTM``'s
    ``(output, (h, c))``, a transformers model with ``return_dict=False``). Anything else is a ``TypeError`` that
    says how to pass an adapter of your own (``BNN(net, likelihood, output_adapter=lambda out: out.my_field)``).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> net_output(SimpleNamespace(logits=torch.zeros(2, 3), hidden_states=None)).shape
    torch.Size([2, 3])
    >>> net_output((torch.zeros(2, 1), "state")).shape
    torch.Size([2, 1])
    """
    if isinstance(output, torch.Tensor | Moments):  # (Moments: under pyro_bbb.moment_propagation())
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor | Moments):
        return logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor | Moments):
        return output[0]
    raise TypeError(
        f"the net returned a {type(output).__name__}; BNN needs a tensor for the likelihood. Pass "
        "output_adapter=... to BNN, a function from the net's output to that tensor "
        "(e.g. `lambda out: out.prediction`)."
    )


def call_net(net: Callable, x: Inputs) -> Any:
    """Call ``net`` on inputs the way :class:`BNN` does: ``net(x)`` for a tensor, ``net(*x)`` for a tuple or list,
    ``net(**x)`` for a mapping (a transformers ``BatchEncoding``).

    Examples
    --------
    >>> call_net(lambda a, b: a + b, (torch.ones(2), torch.ones(2)))
    tensor([2., 2.])
    >>> call_net(lambda input_ids: input_ids.shape, {"input_ids": torch.zeros(3, 5)})
    torch.Size([3, 5])
    """
    if isinstance(x, Mapping):
        return net(**x)
    if not isinstance(x, tuple | list):
        return net(x)
    try:
        return net(*x)
    except TypeError as error:
        _raise_if_too_many_inputs(net, x, error)
        raise


def _raise_if_too_many_inputs(net: Callable, x: tuple | list, error: TypeError) -> None:
    """A tuple of inputs the net's ``forward`` cannot take (e.g. ``(x, y, weights)`` batches of a DataLoader given to
    ``predict``, which reads a batch that is not an ``(x, y)`` pair as the inputs) is named, with the fix: only
    when the error came from the call itself (no frame of the net's own code ran) and ``forward`` cannot bind
    them."""
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    if os.path.abspath(frame.tb_frame.f_code.co_filename) not in _CALLING_FILES:  # raised inside the net's code
        return
    try:
        inspect.signature(net.forward if isinstance(net, torch.nn.Module) else net).bind(*x)
    except TypeError:
        raise TypeError(
            f"BNN called the net on a {type(x).__name__} of {len(x)} inputs (a tuple or list is several inputs: "
            f"net(*x)), which it does not take ({error}). Pass the inputs the net takes; a DataLoader's batches are "
            "(x, y) pairs, or for predict the inputs alone: for batches such as (x, y, weights), give "
            "DataLoader(TensorDataset(x, y))."
        ) from error
    except ValueError:  # (no signature to read: a builtin)
        return


#: where a call that never reached the net's own code fails: torch's and Pyro's module calls, and call_net
_CALLING_FILES = frozenset(os.path.abspath(module.__file__) for module in (torch.nn.modules.module, pyro_module,
                                                                           sys.modules[__name__]))


class BNN(PyroModule):
    """The model ``y ~ likelihood(net(x))`` with the likelihood inside ``pyro.plate(data_plate)``.

    ``net`` may mix :mod:`pyro_bbb.nn` layers with ordinary ``torch.nn`` layers; the ordinary ones are converted
    in place to :class:`~pyro.nn.PyroModule` so their parameters are trained as point estimates by SVI. The net
    runs outside the data plate (its weights are global); the observation is emitted inside it, so the model
    trains with :class:`pyro_bbb.ELBO` (``num_data=N``), with :func:`pyro_bbb.fit`, or with Pyro's own ELBOs in
    a plain :class:`pyro.infer.SVI` loop.

    Pyro's own ELBOs (``Trace_ELBO``, ``TraceMeanField_ELBO``, ``TraceGraph_ELBO``, ``RenyiELBO``, ``JitTrace*``)
    know nothing of the training set's size: on a minibatch they weigh its likelihood against the whole KL, and the
    posterior stays on the prior. Give the model ``num_data=N`` and it declares its data plate over the N rows
    (``pyro.plate(data_plate, N, subsample=...)``), so any ELBO scales a batch of B by ``N / B``. A BNN without it,
    trained by one of Pyro's ELBOs, warns once before the first step; one with it, trained under a ``poutine.scale``
    of ``N / B`` too (Pyro's older minibatch recipe), warns that the batch is scaled twice. :class:`pyro_bbb.ELBO`'s
    own ``num_data`` (what ``fit`` sets) wins over the model's; prediction is the same either way.

    A parameter of ``net`` with ``requires_grad=False`` (a frozen pretrained layer) stays as it is: BNN holds it as
    a buffer of the same name (in the state dict as before), which no Pyro optimizer sees -- as ``pyro.module``
    leaves such a parameter out, where a ``PyroModule`` would hand it to the optimizer and train it. Freeze before
    building the BNN; to train it later, build the BNN from a net whose parameter requires its gradient.

    Parameters
    ----------
    net : torch.nn.Module
        Maps a batch of inputs ``(batch, ...)`` to outputs ``(batch, features)``. It always sees ordinary batches:
        S weight draws (a vectorized ``predict`` or vectorized particles) arrive as ``S * batch`` rows, block ``s``
        belonging to draw ``s`` (see :mod:`pyro_bbb._draws`), so indexing, ``view``, ``cat``, ``nn.Flatten`` and
        pooling behave as without pyro_bbb. Inputs that are a tuple of tensors are passed as ``net(*x)``, a dict
        of tensors (a transformers ``BatchEncoding``) as ``net(**x)`` (see :func:`call_net`).
    likelihood : Likelihood
        E.g. :class:`pyro_bbb.likelihoods.Gaussian`, ``Categorical``.
    data_plate : str
        Name of the plate over data points.
    output_adapter : callable, optional
        Maps the net's output to the tensor the likelihood reads; default :func:`net_output` (a tensor as it is, a
        transformers output's ``logits``, a tuple's first element).
    num_data : int, optional
        Size N of the training set, for Pyro's own ELBOs on minibatches (above); settable later as ``bnn.num_data``.

    Examples
    --------
    >>> net = torch.nn.Sequential(BayesianLinear(4, 16), torch.nn.ReLU(), BayesianLinear(16, 3))
    >>> bnn = BNN(net, likelihoods.Categorical())
    >>> bnn(torch.randn(5, 4)).shape                 # without a guide: a prior predictive draw
    torch.Size([5])
    >>> trace = poutine.trace(bnn).get_trace(torch.randn(5, 4))
    >>> [name for name, site in trace.iter_stochastic_nodes() if name != "data"]   # "data" is the plate
    ['net.0.weight', 'net.0.bias', 'net.2.weight', 'net.2.bias', 'y']

    Several inputs: a tuple goes to ``net(*x)``, a dict to ``net(**x)``.

    >>> class TwoInputs(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = BayesianLinear(3, 1)
    ...     def forward(self, features, mask):
    ...         return self.fc(features * mask)
    >>> BNN(TwoInputs(), likelihoods.Gaussian(0.1))({"features": torch.randn(5, 3), "mask": torch.ones(5, 3)}).shape
    torch.Size([5])

    Pyro's own SVI loop on minibatches: the model knows N, so ``Trace_ELBO`` scales a batch of 32 by 1000 / 32.

    >>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.1), num_data=1000)
    >>> svi = pyro.infer.SVI(bnn, MeanFieldGuide(bnn), pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
    >>> loss = svi.step(torch.randn(32, 3), torch.randn(32))
    >>> poutine.trace(bnn).get_trace(torch.randn(32, 3), torch.randn(32)).nodes["y"]["scale"]
    31.25
    """

    def __init__(self, net: torch.nn.Module, likelihood: Likelihood, data_plate: str = DATA_PLATE,
                 output_adapter: Callable[[Any], torch.Tensor] | None = None, num_data: int | None = None):
        super().__init__()
        if not isinstance(net, torch.nn.Module):
            raise TypeError(f"`net` must be a torch.nn.Module, got {type(net).__name__}.")
        if not isinstance(likelihood, Likelihood):
            raise TypeError(
                f"`likelihood` must be a pyro_bbb.likelihoods.Likelihood (e.g. likelihoods.Gaussian()), got "
                f"{type(likelihood).__name__}."
            )
        if output_adapter is not None and not callable(output_adapter):
            raise TypeError(f"output_adapter must be callable, got {type(output_adapter).__name__}.")
        num_data = check_count("num_data", num_data, optional=True)  # (checked before the net is changed)
        if pyro_module_has_run(net):
            raise ValueError(
                f"this net ({type(net).__name__}, a PyroModule: bayesianize returns one) has been called on its own "
                "already, and Pyro cannot make a module that has run into a part of another one (its sites were "
                "named without the parent's prefix). Wrap it in pyro_bbb.BNN before calling it (bnn.net(x) then "
                "tries the net), or convert the deterministic net again."
            )
        _hold_frozen_parameters_as_buffers(net)
        if isinstance(likelihood, torch.nn.Module):  # (a likelihood of one's own may hold a frozen parameter too)
            _hold_frozen_parameters_as_buffers(likelihood)
        to_pyro_module_(net)
        self.net = net
        self.likelihood = likelihood
        self.data_plate = data_plate
        self.output_adapter = output_adapter or net_output
        self.num_data = num_data
        self._warned_without_num_data = self._warned_scaled_twice = False

    def _apply(self, fn, recurse=True):
        """As ``torch.nn.Module._apply`` (``.to()``, ``.double()``, ...), keeping a buffer that several modules hold
        one tensor (a tied frozen weight: torch converts each module's buffers apart)."""
        holders: dict[int, list[tuple[torch.nn.Module, str]]] = {}
        for module in self.modules():
            for name, buffer in module.named_buffers(recurse=False):
                holders.setdefault(id(buffer), []).append((module, name))
        super()._apply(fn, recurse)
        for (first, first_name), *others in (group for group in holders.values() if len(group) > 1):
            for module, name in others:
                setattr(module, name, module_buffer(first, first_name))
        return self

    @property
    def num_data(self) -> int | None:
        """The training set's size N the data plate is declared with for Pyro's own ELBOs (``None``: the batch's).

        Examples
        --------
        >>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.1))
        >>> bnn.num_data = 500
        >>> bnn.num_data
        500
        """
        return self._num_data

    @num_data.setter
    def num_data(self, value: int | None) -> None:
        self._num_data = check_count("num_data", value, optional=True)  # (an int: numpy integers too)

    def forward(self, x: Inputs, y: torch.Tensor | None = None) -> torch.Tensor:
        output, lead = self._checked_output(x, y)
        num_data = None if y is None else self._declared_num_data(lead[-1])
        with output_batch(lead):
            if num_data is None:  # the likelihood's own signature, as a custom likelihood may have written it
                return self.likelihood(output, y, data_plate=self.data_plate)
            return self.likelihood(output, y, data_plate=self.data_plate, num_data=num_data)

    def _declared_num_data(self, rows: int) -> int | None:
        """The size to declare the data plate with for a batch of ``rows`` targets: the model's N, unless
        :class:`pyro_bbb.ELBO` is scaling the plate with its own; warns once when one of Pyro's ELBOs trains a model
        that does not know N."""
        scalers = active_data_plate_scalers()
        if any(scaler.num_data is not None for scaler in scalers):
            return None  # the objective owns N (fit, pyro_bbb.ELBO(num_data=N))
        if self.num_data is None:
            if not self._warned_without_num_data and replayed_for_gradients():  # (no objective knows N either)
                self._warned_without_num_data = True
                warn_at_caller(
                    f"BNN does not know the training set's size, so this ELBO weighs the likelihood of this batch of "
                    f"{rows} rows against the whole KL as if they were all the data: on minibatches the posterior "
                    f"stays on its prior. Pass BNN(..., num_data=N) (or set bnn.num_data = N) with N the number of "
                    f"training rows, or train with pyro_bbb.ELBO(num_data=N) or pyro_bbb.fit. (Training on all "
                    f"{rows} rows at once? Set num_data={rows} to say so.)",
                )
            return None
        if rows > self.num_data:
            raise ValueError(
                f"a batch of {rows} rows is larger than the model's num_data={self.num_data}, the size of the whole "
                "training set its data plate is declared with. Set bnn.num_data to the training set's size (or to "
                "None to evaluate on another data set)."
            )
        if not scalers and rows < self.num_data:
            self._warn_if_scaled_twice(rows)
        return self.num_data

    def _warn_if_scaled_twice(self, rows: int) -> None:
        """Warns once when one of Pyro's ELBOs trains this model under a ``poutine.scale`` of ``N / B`` (Pyro's older
        minibatch recipe): the data plate declared with N scales the batch by ``N / B`` itself, so the likelihood
        would count ``(N / B)^2`` times. (:class:`pyro_bbb.ELBO` says so at the observation site.)"""
        if self._warned_scaled_twice or not replayed_for_gradients():
            return
        scale = math.prod(float(s) for s in map(torch.as_tensor, active_scales()) if s.numel() == 1)
        once = self.num_data / rows
        if math.isclose(scale, once, rel_tol=1e-6):
            self._warned_scaled_twice = True
            warn_at_caller(
                f"this BNN is trained under a poutine.scale of N / B = {once:g} (Pyro's older minibatch recipe), and "
                f"its data plate, declared with num_data={self.num_data}, scales the batch of {rows} rows to N itself: "
                f"the likelihood counts (N / B)^2 = {once * once:g} times and the posterior comes out too narrow. "
                "Drop the poutine.scale (or set bnn.num_data = None and keep it).",
            )

    def observation(self, x: Inputs, y: torch.Tensor | None = None):
        """The observation site's distribution for inputs ``x`` and the checked targets: the net run (its weights
        read from their sites, or from a guide's draw under replay) and the likelihood's
        :meth:`~pyro_bbb.likelihoods.Likelihood.observation`, without the observation's ``pyro.sample``.

        Examples
        --------
        >>> bnn = BNN(BayesianLinear(4, 3), likelihoods.Categorical())
        >>> fn, y = bnn.observation(torch.randn(5, 4), torch.zeros(5, dtype=torch.long))
        >>> fn.batch_shape, y.shape
        (torch.Size([5]), torch.Size([5]))
        """
        output, lead = self._checked_output(x, y)
        # a PyroSample of the likelihood's (a learned noise scale) is sampled as in forward: a guide's draw under replay
        with output_batch(lead), pyro_module_context(self):
            return self.likelihood.observation(output, y)

    def _checked_output(self, x: Inputs, y: torch.Tensor | None) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The net's output for ``x`` (under the data plate's name), once ``x`` and ``y`` agree on their rows, and
        the dimensions it starts with before its own per-row shape: ``(*draw shape, rows)``."""
        for name, value in (("x", x), ("y", y)):
            if type(value).__module__ == "numpy":  # fit, predict and the metrics convert; a Pyro loop calls us as is
                raise TypeError(
                    f"{name} is a numpy {type(value).__name__}; a BNN called directly (a Pyro SVI step, Predictive) "
                    f"takes torch tensors: pass torch.as_tensor({name}) (pyro_bbb.fit and predict convert for you).")
        if isinstance(x, torch.Tensor) and x.dim() == 0:
            raise ValueError("x is a 0-d tensor; BNN needs inputs with a first dimension over the data.")
        rows = num_rows(x)  # also: a clear TypeError for anything but tensors, tuples and dicts of tensors
        if y is not None and (y.dim() == 0 or y.shape[0] != rows):
            raise ValueError(
                f"x has {rows} rows but y has {y.shape[0] if y.dim() else 0}; every input needs exactly one target."
            )
        if y is not None and rows == 0:
            raise ValueError(
                "x and y have 0 rows: an empty batch has no likelihood to scale up to the training set. Skip empty "
                "batches in your loop (a filter that selected no rows, an empty last batch)."
            )
        with data_plate_named(self.data_plate):
            draw_shape = _draw_shape(self.data_plate)
            return self._run_net(x, rows, draw_shape), (*draw_shape, rows)

    def _run_net(self, x: Inputs, rows: int, draw_shape: tuple[int, ...]) -> torch.Tensor:
        """The net on an ordinary batch of ``rows`` rows: the weight draws of the sample plates around this call
        (``draw_shape``) are folded into ``S * rows`` rows, and the output is unfolded to ``(*draw_shape, rows, ...)``
        for the likelihood."""
        num_draws = math.prod(draw_shape)
        if not draw_shape:
            with batch_rows(rows):
                return self.output_adapter(call_net(self.net, x))

        def fold(t: torch.Tensor) -> torch.Tensor:
            return t.unsqueeze(0).expand(num_draws, *t.shape).reshape(num_draws * rows, *t.shape[1:])

        with fold_draws(num_draws), batch_rows(rows):
            output = self.output_adapter(call_net(self.net, map_inputs(fold, x)))
        if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != num_draws * rows:
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise ValueError(
                f"the net returned {shape} for a batch of {num_draws * rows} rows; BNN needs one output row per input "
                "row (the batch dimension first)."
            )
        return output.reshape(*draw_shape, rows, *output.shape[1:])


def _hold_frozen_parameters_as_buffers(net: torch.nn.Module) -> None:
    """Each ``Parameter`` of ``net`` that does not require its gradient becomes a buffer of the same name (one
    tensor for a parameter that several modules hold), so that Pyro, which makes every parameter it lifts into its
    param store trainable, leaves it as it is."""
    buffers: dict[int, torch.Tensor] = {}
    for module in net.modules():
        for name, param in list(module.named_parameters(recurse=False, remove_duplicate=False)):
            if not param.requires_grad:
                buffer = buffers.setdefault(id(param), param.detach())
                delattr(module, name)
                module.register_buffer(name, buffer)


def _draw_shape(data_plate: str) -> tuple[int, ...]:
    """The batch shape of a global site under the vectorized plates around this call (weight draws), left of the
    data plate's dimension -1: ``(S,)`` under one sample plate at dim -2; ``()`` when there is none."""
    frames = [f for f in get_plates() if f.vectorized and f.dim is not None and f.name != data_plate]
    if not frames:
        return ()
    if any(f.dim == -1 for f in frames):
        raise ValueError(
            f"pyro.plate({next(f.name for f in frames if f.dim == -1)!r}) occupies dimension -1, where BNN puts its "
            f"data plate {data_plate!r}; give the outer plate dim=-2 (or lower)."
        )
    shape = [1] * (-min(f.dim for f in frames) - 1)
    for f in frames:
        shape[f.dim + 1] = f.size
    return tuple(shape)

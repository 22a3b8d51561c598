"""Bayesian recurrent layers: ``BayesianLSTM``, ``BayesianGRU`` and their cells, twins of ``torch.nn``'s.

Every weight and bias (input-to-hidden and hidden-to-hidden, per layer and direction) is its own sample site, so
each KL is counted once per step. The weights are drawn once per sequence (one draw per SVI step, not per time
step): the layer reads each site once, turns it into a map with :func:`~pyro_bbb.nn.functional.bayesian_affine_map`
and runs the time loop on plain tensors. Under :func:`pyro_bbb.flipout` those maps carry sign vectors drawn once per
example and shared by every time step.

Examples
--------
>>> lstm = BayesianLSTM(7, 4, batch_first=True)
>>> output, (h_n, c_n) = lstm(torch.randn(2, 12, 7))
>>> output.shape, h_n.shape, c_n.shape
(torch.Size([2, 12, 4]), torch.Size([1, 2, 4]), torch.Size([1, 2, 4]))
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .._draws import draws_leading, fold_rows, folded_draws, unfold_rows
from .._internals import active_handlers_of, pyro_name, site_name
from ..priors import Normal, Prior
from ._fused_kernel import RecurrentKernel, map_state
from ._time_loop import recurrence
from .functional import AffineMap, FlipoutMap, batched_linear, bayesian_affine_map, sample_dims
from .module import BayesianModule

__all__ = ["BayesianLSTMCell", "BayesianGRUCell", "BayesianLSTM", "BayesianGRU", "DEFAULT_RECURRENT_PRIOR"]

#: The prior of a recurrent layer's weights and biases when none is given: ``Normal(0, 2)``, wider than the
#: feed-forward default (:data:`pyro_bbb.priors.DEFAULT_PRIOR`): narrower priors (N(0, 1), N(0, 0.5), and the
#: empirical-Bayes scales, which follow a posterior that has not left zero yet on a plateau) pull recurrent weights to
#: zero faster than the data pins them down (``benchmarks/README.md`` compares the widths on the Embedded Reber
#: Grammar).
DEFAULT_RECURRENT_PRIOR = Normal(0.0, 2.0)


def _lstm_step(gates: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    i, f, g, o = gates.chunk(4, -1)
    c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _gru_step(input_part: torch.Tensor, hidden_part: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    ir, iz, in_ = input_part.chunk(3, -1)
    hr, hz, hn = hidden_part.chunk(3, -1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(in_ + r * hn)
    return (1 - z) * n + z * h


def _hold(new, old, alive: torch.Tensor):
    """The new state where ``alive``, the old one elsewhere (an LSTM's ``(h, c)`` or a GRU's ``h``)."""
    if isinstance(new, tuple):
        return tuple(torch.where(alive, n, o) for n, o in zip(new, old))
    return torch.where(alive, new, old)


def _whole_sequence(maps, projected, state, alive) -> dict | None:
    """The hidden-to-hidden arguments of :func:`~pyro_bbb.nn._time_loop.recurrence` when it can run this layer's
    time loop: one draw (2-D weights), ``(B, H)`` states, no projection and no lengths; else ``None``."""
    if alive is not None or len(maps) != 2 or projected.dim() != 3:
        return None
    if any(h.dim() != 2 for h in (state if isinstance(state, tuple) else (state,))):
        return None
    hidden = maps[1]
    if isinstance(hidden, FlipoutMap):
        if hidden.loc.dim() != 2 or hidden.sign_in.dim() != 2 or hidden.sign_out.dim() != 2:
            return None
        if hidden.bias_loc is not None and hidden.bias_loc.dim() != 1:
            return None
        return {"weight": hidden.loc, "bias": hidden.bias_loc, "delta": hidden.delta, "bias_delta": hidden.bias_delta,
                "sign_in": hidden.sign_in, "sign_out": hidden.sign_out}
    if isinstance(hidden, AffineMap) and hidden.weight.dim() == 2 and (hidden.bias is None or hidden.bias.dim() == 1):
        return {"weight": hidden.weight, "bias": hidden.bias}
    return None


class _Recurrent(BayesianModule):
    """Shared machinery: sites named like ``torch.nn``'s, one map per weight per sequence, the gate arithmetic."""

    _mode: str  # "LSTM" or "GRU"
    _first_suffix = ""  # the name suffix of the first input-to-hidden weight

    def _declare_from(self, twin: nn.Module, fan_in: dict[str, int], recurrent_prior: Prior | None) -> None:
        for name, param in twin.named_parameters():
            recurrent = name.startswith("weight_hh")
            self._declare_bayesian(name, param, fan_in[name], recurrent_prior if recurrent else None)

    def reset_parameters(self) -> None:
        """Redraw the initial values as torch.nn's recurrent layers do (uniform within ``1 / sqrt(hidden_size)``),
        the kept gate's biases set as at construction. A guide reads them when it is set up.

        Examples
        --------
        >>> layer = BayesianGRUCell(3, 4)
        >>> layer.reset_parameters()
        >>> bool(layer.initial_values()["weight_ih"].abs().max() <= 0.5)
        True
        """
        bound = 1.0 / math.sqrt(self.hidden_size)
        for name, value in self.initial_values(full_names=False).items():
            self.set_initial_value(name, torch.empty_like(value).uniform_(-bound, bound))
        self._set_keep_gate_bias(self.__dict__.get("_keep_gate_bias"))

    def _set_keep_gate_bias(self, bias: float | None) -> None:
        """Start the gate that keeps the state -- an LSTM's forget gate, a GRU's update gate, the second block of
        both -- at ``sigmoid(bias)``: the input-to-hidden biases' initial posterior means of that gate become
        ``bias``, the hidden-to-hidden ones 0 (``None``: torch's initialisation)."""
        self.__dict__["_keep_gate_bias"] = bias  # (reset_parameters sets it again)
        if bias is None:
            return
        size = self.hidden_size
        for name in self.bayesian_parameters():
            if name.startswith("bias_"):
                value = getattr(self, f"{name}_init").clone()
                value[size : 2 * size] = bias if name.startswith("bias_ih") else 0.0
                self.set_initial_value(name, value)

    def _map(self, suffix: str, example_shape: torch.Size, sequence: bool = False, projection: bool = False):
        """``x -> W_ih x + b_ih`` and ``h -> W_hh h + b_hh`` (and an LSTM's projection ``h -> W_hr h``) for one
        layer/direction, drawn once. With ``sequence`` the input map takes a whole sequence ``(..., B, T,
        features)`` at once (one matrix product for all steps)."""
        prefix = pyro_name(self)
        maps = []
        for kind, time_dims in (("ih", int(sequence)), ("hh", 0), ("hr", 0))[: 3 if projection else 2]:
            weight_name, bias_name = f"weight_{kind}{suffix}", f"bias_{kind}{suffix}"
            has_bias = bias_name in self._bayesian
            weight, bias = getattr(self, weight_name), getattr(self, bias_name) if has_bias else None
            draw = weight  # (the site's draw itself: an estimator tells a second use of it apart)
            num_draws = folded_draws()
            if num_draws is not None:  # the draws as (S, 1, *param), lined up with the unfolded (S, B, ...) input
                weight, bias = draws_leading(weight, 2, num_draws), draws_leading(bias, 1, num_draws)
                weight = weight.unsqueeze(1) if weight.dim() > 2 else weight
                bias = bias.unsqueeze(1) if bias is not None and bias.dim() > 1 else bias
            maps.append(bayesian_affine_map(
                weight, bias,
                apply=batched_linear, feature_dims=1, example_shape=tuple(example_shape), time_dims=time_dims,
                draw=draw, weight_site=site_name(prefix, weight_name),
                bias_site=site_name(prefix, bias_name) if has_bias else None,
            ))
        return maps

    def _step(self, maps, x_t: torch.Tensor, state, projected: bool = False):
        """One time step; ``projected``: ``x_t`` is already ``W_ih x_t + b_ih``."""
        input_to_hidden, hidden_to_hidden = maps[:2]
        h = state[0] if self._mode == "LSTM" else state
        x_part = x_t if projected else input_to_hidden(x_t)
        if self._mode == "LSTM":
            h, c = _lstm_step(x_part + hidden_to_hidden(h), state)
            return (maps[2](h), c) if len(maps) > 2 else (h, c)
        return _gru_step(x_part, hidden_to_hidden(h), h)

    def _sample_shape(self, suffix: str) -> torch.Size:
        """Leading draw dimensions of this layer's weights (e.g. ``(S, 1)`` under a vectorized predictive)."""
        weight = getattr(self, f"weight_ih{suffix}")
        num_draws = folded_draws()
        if num_draws is not None:
            weight = draws_leading(weight, 2, num_draws)
        return sample_dims(weight, feature_dims=1)

    def _map_state(self, state, fn):
        """``fn`` on a recurrent state: each of an LSTM's ``(h, c)``, a GRU's ``h``."""
        return map_state(self._mode, state, fn)

    def _unfolds(self) -> int | None:
        """The number of draws folded into the batch when this layer's weights carry them, else ``None``."""
        num_draws = folded_draws()
        if num_draws is None or num_draws == 1 or self._sample_shape(self._first_suffix) == ():
            return None
        return num_draws

    def _check_input(self, input: torch.Tensor, size: int, where: str) -> None:
        if input.dim() == 0 or input.shape[-1] != size:
            raise ValueError(
                f"{type(self).__name__}(input_size={size}) expects {where} whose last dimension is {size}, got shape "
                f"{tuple(input.shape)}."
            )
        self._check_dtype(input, getattr(self, f"weight_ih{self._first_suffix}").dtype)  # the draw's dtype


class _RecurrentCell(_Recurrent):
    """One time step; weights and Flipout signs are reused by every call within one model run."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, *, prior=None,
                 recurrent_prior=None):
        super().__init__(DEFAULT_RECURRENT_PRIOR if prior is None else prior)
        self.input_size, self.hidden_size = input_size, hidden_size
        twin = getattr(nn, f"{self._mode}Cell")(input_size, hidden_size, bias=bias, device=device, dtype=dtype)
        fan_in = {"weight_ih": input_size, "weight_hh": hidden_size, "bias_ih": hidden_size, "bias_hh": hidden_size}
        self._declare_from(twin, fan_in, recurrent_prior)

    def _cached_maps(self, example_shape: torch.Size):
        # the same weight tensors (PyroModule caches a site within one model run) under the same estimators -> the
        # same maps and signs (a draw replayed under another handler, or none, gets that handler's maps)
        weights = (self.weight_ih, self.weight_hh, *active_handlers_of("bayesian_affine_map"))
        cached = self.__dict__.get("_maps")
        fresh = cached is None or cached[1] != example_shape or len(cached[0]) != len(weights) or any(
            a is not b for a, b in zip(cached[0], weights))
        if fresh:
            cached = self.__dict__["_maps"] = (weights, example_shape, self._map("", example_shape))
        return cached[2]

    def _run_folding(self, input: torch.Tensor, hx):
        """``_run``, with folded rows (see :mod:`pyro_bbb._draws`) unfolded into ``(S, B)`` and folded back."""
        num_draws = self._unfolds()
        if num_draws is None:
            return self._run(input, hx)
        state = None if hx is None else self._map_state(hx, lambda h: unfold_rows(h, num_draws, h.dim() - 2))
        state = self._run(unfold_rows(input, num_draws, input.dim() - 2), state)
        return self._map_state(state, lambda h: fold_rows(h, h.dim() - 3))

    def _zeros(self, input: torch.Tensor) -> torch.Tensor:
        shape = torch.broadcast_shapes(input.shape[:-1], self._sample_shape("")) + (self.hidden_size,)
        return input.new_zeros(shape)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={'bias_ih' in self._bayesian}, {self._prior_repr()}"


class BayesianLSTMCell(_RecurrentCell):
    """Bayesian twin of :class:`torch.nn.LSTMCell`: ``(h_1, c_1) = cell(input, (h_0, c_0))``.

    Parameters
    ----------
    input_size, hidden_size, bias :
        As in :class:`torch.nn.LSTMCell`.
    prior : Prior, optional
        Prior of every weight and bias (default :data:`DEFAULT_RECURRENT_PRIOR`, ``Normal(0, 2)``).
    recurrent_prior : Prior, optional
        A different prior for the hidden-to-hidden weights.
    forget_bias : float or None
        Initial posterior mean of the forget gate's input-to-hidden bias (the hidden-to-hidden one starts at 0), so
        that the cell keeps its state early in training; ``None`` keeps torch's initialisation. See
        :class:`BayesianLSTM`.

    Examples
    --------
    >>> cell = BayesianLSTMCell(3, 5)
    >>> h, c = cell(torch.randn(2, 3))
    >>> h.shape, c.shape
    (torch.Size([2, 5]), torch.Size([2, 5]))
    """

    _mode = "LSTM"

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, *, prior=None,
                 recurrent_prior=None, forget_bias: float | None = 1.0):
        super().__init__(input_size, hidden_size, bias, device, dtype, prior=prior, recurrent_prior=recurrent_prior)
        self._set_keep_gate_bias(forget_bias)

    def forward(self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        self._check_input(input, self.input_size, "an input")
        return self._run_folding(input, hx)

    def _run(self, input, hx):
        if hx is None:
            hx = (self._zeros(input), self._zeros(input))
        return self._step(self._cached_maps(input.shape[:-1]), input, hx)


class BayesianGRUCell(_RecurrentCell):
    """Bayesian twin of :class:`torch.nn.GRUCell`: ``h_1 = cell(input, h_0)``; ``prior`` / ``recurrent_prior`` as
    in :class:`BayesianLSTMCell`, ``update_bias`` as in :class:`BayesianGRU`.

    Examples
    --------
    >>> BayesianGRUCell(3, 5)(torch.randn(2, 3)).shape
    torch.Size([2, 5])
    """

    _mode = "GRU"

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, *, prior=None,
                 recurrent_prior=None, update_bias: float | None = 1.0):
        super().__init__(input_size, hidden_size, bias, device, dtype, prior=prior, recurrent_prior=recurrent_prior)
        self._set_keep_gate_bias(update_bias)

    def forward(self, input: torch.Tensor, hx: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(input, self.input_size, "an input")
        return self._run_folding(input, hx)

    def _run(self, input, hx):
        if hx is None:
            hx = self._zeros(input)
        return self._step(self._cached_maps(input.shape[:-1]), input, hx)


class _RecurrentLayer(_Recurrent):
    _first_suffix = "_l0"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, *, prior=None, recurrent_prior=None):
        super().__init__(DEFAULT_RECURRENT_PRIOR if prior is None else prior)
        settings = dict(num_layers=num_layers, bias=bias, batch_first=batch_first, dropout=dropout,
                        bidirectional=bidirectional, **({"proj_size": proj_size} if proj_size else {}))
        twin = getattr(nn, self._mode)(input_size, hidden_size, device=device, dtype=dtype, **settings)
        # torch's fused kernel, run with the drawn weights where it applies
        self.__dict__["_kernel"] = RecurrentKernel(self._mode, input_size, hidden_size, num_layers, has_biases=bias,
                                                   batch_first=batch_first, dropout=dropout,
                                                   bidirectional=bidirectional, proj_size=proj_size)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.batch_first, self.dropout, self.bidirectional = batch_first, float(dropout), bidirectional
        self.proj_size = proj_size
        self.num_directions = 2 if bidirectional else 1
        output_size = proj_size or hidden_size
        fan_in = {}
        for name, _ in twin.named_parameters():
            layer = int(name.split("_l")[1].split("_")[0])
            below = input_size if layer == 0 else output_size * self.num_directions
            fan_in[name] = {"weight_ih": below, "weight_hh": output_size}.get(name[:9], hidden_size)
        self._declare_from(twin, fan_in, recurrent_prior)

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"][: self.num_directions]

    def flatten_parameters(self) -> None:
        """Nothing to do: torch.nn's call to compact cuDNN's weights, which code written for ``torch.nn.LSTM`` makes
        (the weights here are drawn at every run).

        Examples
        --------
        >>> BayesianLSTM(3, 4).flatten_parameters()
        """

    def forward(self, input: torch.Tensor | PackedSequence, hx=None):
        """``input`` is ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``), possibly with leading
        draw dimensions, or a :class:`~torch.nn.utils.rnn.PackedSequence`; returns ``(output, (h_n, c_n))`` for an
        LSTM and ``(output, h_n)`` for a GRU (``output`` packed like the input)."""
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        self._check_input(input, self.input_size, "an input")
        if input.dim() == 2:  # one sequence without a batch dimension, (T, features), as torch.nn takes it
            def one(t):
                return t.unsqueeze(1)

            state_in = None if hx is None else tuple(map(one, hx)) if isinstance(hx, tuple) else one(hx)
            output, state = self._forward_padded(input.unsqueeze(0 if self.batch_first else 1), state_in)
            state = tuple(s.squeeze(1) for s in state) if isinstance(state, tuple) else state.squeeze(1)
            return output.squeeze(0 if self.batch_first else 1), state
        return self._forward_padded(input, hx)

    def _forward_packed(self, packed: PackedSequence, hx):
        """A packed batch: torch's kernel on the packed data when it applies; otherwise the padded sequences, each
        example's steps beyond its length masked (its state held, its output zero), packed again like the input."""
        self._check_input(packed.data, self.input_size, "a packed sequence")
        padded, lengths = pad_packed_sequence(packed, batch_first=self.batch_first)
        output, state = self._forward_padded(padded, hx, lengths.to(padded.device), packed)
        if isinstance(output, PackedSequence):
            return output, state
        batch_dim = 0 if self.batch_first else 1
        order = packed.sorted_indices
        if order is not None:
            output, lengths = output.index_select(batch_dim, order), lengths[order.cpu()]
        data = pack_padded_sequence(output, lengths, batch_first=self.batch_first, enforce_sorted=True).data
        return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices), state

    def _forward_padded(self, input: torch.Tensor, hx, lengths: torch.Tensor | None = None,
                        packed: PackedSequence | None = None):
        num_draws = self._unfolds()
        if num_draws is None:
            return self._run(input, hx, lengths, packed)
        # folded rows (see pyro_bbb._draws): unfold the batch dimension into (S, B) with S in front, run, fold back
        batch_dim = input.dim() - (3 if self.batch_first else 2)
        sequence = unfold_rows(input, num_draws, batch_dim).movedim(batch_dim, 0)
        maps = self._all_maps(sequence.shape[:-2] if self.batch_first else sequence.movedim(-3, -2).shape[:-2])
        if lengths is None:
            kernel = self.__dict__["_kernel"]
            per_draw = kernel.grouped(maps, input, hx, num_draws, batch_dim, self.training)
            if per_draw is None:
                per_draw = kernel.per_draw(maps, input, hx, num_draws, batch_dim, self.training)
            if per_draw is not None:
                return per_draw
        state = None if hx is None else self._map_state(hx, lambda h: unfold_rows(h, num_draws, h.dim() - 2)
                                                        .movedim(h.dim() - 2, 0))
        lengths = None if lengths is None else unfold_rows(lengths, num_draws, 0)
        output, state = self._run(sequence, state, lengths, maps=maps)
        output = fold_rows(output.movedim(0, batch_dim), batch_dim)
        return output, self._map_state(state, lambda h: fold_rows(h.movedim(0, h.dim() - 3), h.dim() - 3))

    def _all_maps(self, example_shape: torch.Size) -> dict[str, list]:
        """Every layer's and direction's maps (each site read once, in torch's parameter order)."""
        return {suffix: self._map(suffix, example_shape, sequence=True, projection=bool(self.proj_size))
                for layer in range(self.num_layers) for suffix in self._suffixes(layer)}

    def _run(self, input: torch.Tensor, hx, lengths: torch.Tensor | None = None,
             packed: PackedSequence | None = None, maps: dict[str, list] | None = None):
        sequence_in = input if self.batch_first else input.movedim(-3, -2)  # (..., B, T, features)
        example_shape = sequence_in.shape[:-2]
        maps = self._all_maps(example_shape) if maps is None else maps
        fused = self.__dict__["_kernel"].single(maps, packed if packed is not None else input, hx, self.training)
        if fused is not None:
            return fused
        lead = torch.broadcast_shapes(example_shape, self._sample_shape("_l0"))
        h0, c0 = self._initial_state(hx, lead, input)
        steps = sequence_in.shape[-2]
        alive = None if lengths is None else [(t < lengths).unsqueeze(-1) for t in range(steps)]
        finals_h, finals_c = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction, suffix in enumerate(self._suffixes(layer)):
                layer_maps = maps[suffix]
                projected = layer_maps[0](sequence_in)  # the input projection of every step in one product
                index = layer * self.num_directions + direction
                state = (h0[..., index, :, :], c0[..., index, :, :]) if self._mode == "LSTM" else h0[..., index, :, :]
                whole = _whole_sequence(layer_maps, projected, state, alive)
                if whole is not None:  # the time loop as one operation (its backward by hand)
                    output, state = recurrence(self._mode, projected, state, **whole, reverse=direction == 1)
                    outputs.append(output)
                    finals_h.append(state[0] if self._mode == "LSTM" else state)
                    if self._mode == "LSTM":
                        finals_c.append(state[1])
                    continue
                projected = projected.unbind(-2)
                order = range(steps) if direction == 0 else reversed(range(steps))
                hidden = [None] * steps
                for t in order:
                    new = self._step(layer_maps, projected[t], state, projected=True)
                    # beyond an example's length its state is held (and its output is zero)
                    state = new if alive is None else _hold(new, state, alive[t])
                    h = state[0] if self._mode == "LSTM" else state
                    hidden[t] = h if alive is None else h * alive[t]
                outputs.append(torch.stack(hidden, -2))
                finals_h.append(state[0] if self._mode == "LSTM" else state)
                if self._mode == "LSTM":
                    finals_c.append(state[1])
            sequence_in = torch.cat(outputs, -1) if len(outputs) > 1 else outputs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                sequence_in = F.dropout(sequence_in, self.dropout, training=True)
        output = sequence_in if self.batch_first else sequence_in.movedim(-2, -3)
        h_n = torch.stack(finals_h, -3)
        return (output, (h_n, torch.stack(finals_c, -3))) if self._mode == "LSTM" else (output, h_n)

    def _initial_state(self, hx, lead: torch.Size, input: torch.Tensor):
        def zeros(size: int) -> torch.Tensor:
            return input.new_zeros(lead[:-1] + (self.num_layers * self.num_directions,) + lead[-1:] + (size,))

        if hx is None:
            return zeros(self.proj_size or self.hidden_size), zeros(self.hidden_size)
        if self._mode == "LSTM":
            return hx
        return hx, None

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if "bias_ih_l0" not in self._bayesian:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        return f"{s}, {self._prior_repr()}"


class BayesianLSTM(_RecurrentLayer):
    """Bayesian twin of :class:`torch.nn.LSTM`: same arguments, shapes and ``(output, (h_n, c_n))``.

    Sites are named like ``torch.nn.LSTM``'s parameters (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
    ``bias_hh_l0``, ``weight_hr_l0`` with ``proj_size``, ``..._reverse``). One weight draw serves the whole
    sequence: when one draw serves every example (reparameterization, not a vectorized ``predict``), the sampled
    weights run through torch's own fused kernel (``torch.func.functional_call``), and so do folded draws (a
    vectorized ``predict``: groups of draws on a block diagonal, one kernel call per group; vectorized particles: one
    call per draw); under Flipout the layer runs its own time loop (the input projection of all steps is one
    product).
    ``PackedSequence`` inputs give packed outputs, as torch's do. Use ``fit(..., clip_norm=...)``: gradient
    clipping matters for recurrent nets, Bayesian or not; and warm the KL weight up over the first half of training
    (``fit(..., kl_weight=schedules.LinearWarmup(steps // 2))``), so that the KL does not pull the weights to
    zero before the data has pinned them down (``benchmarks/README.md`` has the measurement).

    Parameters
    ----------
    input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size :
        As in :class:`torch.nn.LSTM` (``proj_size`` is keyword-only here).
    prior : Prior, optional
        Prior of every weight and bias (default :data:`DEFAULT_RECURRENT_PRIOR`, ``Normal(0, 2)``).
    recurrent_prior : Prior, optional
        A different prior for the hidden-to-hidden weights.
    forget_bias : float or None
        Initial posterior mean of every forget gate's input-to-hidden bias (the hidden-to-hidden ones start at 0):
        ``sigmoid(1) = 0.73`` keeps the state through padding and long gaps early in training. With torch's
        initialisation (``None``) one Bayesian seed in five of the Embedded Reber task never left chance
        (``benchmarks/reber_convergence.py``); a bias of 1 removed that stall.

    Examples
    --------
    >>> BayesianLSTM(7, 4, num_layers=2, bidirectional=True, recurrent_prior=priors.Normal(0.0, 0.5))
    BayesianLSTM(7, 4, num_layers=2, bidirectional=True, prior=Normal(loc=0.0, scale=2.0), \
weight_hh_l0_prior=Normal(loc=0.0, scale=0.5), weight_hh_l0_reverse_prior=Normal(loc=0.0, scale=0.5), \
weight_hh_l1_prior=Normal(loc=0.0, scale=0.5), weight_hh_l1_reverse_prior=Normal(loc=0.0, scale=0.5))
    """

    _mode = "LSTM"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, *, prior=None, recurrent_prior=None,
                 forget_bias: float | None = 1.0):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size,
                         device, dtype, prior=prior, recurrent_prior=recurrent_prior)
        self._set_keep_gate_bias(forget_bias)


class BayesianGRU(_RecurrentLayer):
    """Bayesian twin of :class:`torch.nn.GRU`: same arguments, shapes and ``(output, h_n)``; see
    :class:`BayesianLSTM`.

    Parameters
    ----------
    proj_size : int
        torch's slot, kept so that a positional call means what it means to :class:`torch.nn.GRU`; like torch, only
        0 (a projection is an LSTM's).
    update_bias : float or None
        Initial posterior mean of every update gate's input-to-hidden bias (``z`` in ``h' = (1 - z) n + z h``; the
        hidden-to-hidden ones start at 0): ``sigmoid(1) = 0.73`` keeps the state early in training, as an LSTM's
        forget-gate bias does (``benchmarks/README.md`` measures it on the Embedded Reber task); ``None`` keeps
        torch's initialisation.

    Examples
    --------
    >>> output, h_n = BayesianGRU(3, 5, num_layers=2)(torch.randn(6, 2, 3))
    >>> output.shape, h_n.shape
    (torch.Size([6, 2, 5]), torch.Size([2, 2, 5]))
    """

    _mode = "GRU"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, *, prior=None, recurrent_prior=None,
                 update_bias: float | None = 1.0):
        if proj_size:  # (torch's slot, kept so that its positional calls mean the same here)
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0, device,
                         dtype, prior=prior, recurrent_prior=recurrent_prior)
        self._set_keep_gate_bias(update_bias)

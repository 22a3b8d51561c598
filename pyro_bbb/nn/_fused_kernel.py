"""torch's fused LSTM/GRU kernel run with a Bayesian recurrent layer's drawn weights: when one plain draw serves every
example, once per draw of a vectorized predictive, or for G draws at once on a block diagonal.

The layers of :mod:`pyro_bbb.nn.recurrent` ask :class:`RecurrentKernel` first and run their own time loop when it
answers ``None`` (an estimator's maps, packed lengths it cannot take, gradients through grouped draws).

Examples
--------
>>> kernel = RecurrentKernel("GRU", 3, 4, has_biases=True)
>>> from pyro_bbb.nn.functional import batched_linear
>>> maps = {"_l0": [AffineMap(torch.randn(12, k), torch.zeros(12), apply=batched_linear) for k in (3, 4)]}
>>> output, h_n = kernel.single(maps, torch.randn(5, 2, 3), None, training=False)
>>> output.shape, h_n.shape
(torch.Size([5, 2, 4]), torch.Size([1, 2, 4]))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from .._draws import fold_rows, unfold_rows
from .._internals import recurrent_kernel
from .functional import AffineMap

__all__ = ["RecurrentKernel", "GROUPED_WIDTH", "map_state"]

#: The hidden width (draws x hidden size) of one kernel call of a vectorized ``predict`` of an LSTM: draws are grouped
#: on a block diagonal up to this width (``LSTM(8)``: 8 draws a call), beyond which the zeros' work outgrows the calls
#: saved.
GROUPED_WIDTH = 64

_NO_ONEDNN = "LSTM with projections is not supported with oneDNN"


def map_state(mode: str, state, fn: Callable):
    """``fn`` on a recurrent state: each of an LSTM's ``(h, c)``, a GRU's ``h``.

    Examples
    --------
    >>> map_state("LSTM", (torch.ones(1), torch.zeros(1)), lambda h: h + 1)
    (tensor([2.]), tensor([1.]))
    """
    return tuple(fn(h) for h in state) if mode == "LSTM" else fn(state)


def _block_diagonal(weight: torch.Tensor, size: int, blocks: int) -> torch.Tensor:
    """G draws of an LSTM weight ``(4 * size, blocks * K)`` as one ``(4 * G * size, blocks * G * K)`` weight: rows
    gate-major (gate, draw, unit), columns (block, draw, k), zero between draws."""
    count, _, columns = weight.shape
    inner = columns // blocks
    source = weight.reshape(count, 4, size, blocks, inner)
    out = weight.new_zeros(4, count, size, blocks, count, inner)
    out.diagonal(dim1=1, dim2=4).copy_(source.permute(1, 2, 3, 4, 0))
    return out.reshape(4 * count * size, blocks * count * inner)


class RecurrentKernel:
    """torch's whole-sequence kernel for one recurrent layer's settings, fed the layer's maps (one list of
    :class:`~pyro_bbb.nn.functional.AffineMap` per layer and direction, keyed by torch's name suffix ``_l0``,
    ``_l0_reverse``, ...). Each method returns ``(output, state)`` as ``torch.nn.LSTM``/``GRU`` does, or ``None``
    when it does not apply.

    Examples
    --------
    See the module example.
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, *, has_biases: bool,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0):
        self.mode, self.hidden_size, self.num_layers = mode, hidden_size, num_layers
        self.has_biases, self.batch_first, self.dropout = has_biases, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        self.num_directions = 2 if bidirectional else 1
        settings = dict(num_layers=num_layers, bias=has_biases, batch_first=batch_first, dropout=dropout,
                        bidirectional=bidirectional, **({"proj_size": proj_size} if proj_size else {}))
        # run with the drawn weights (torch.func.functional_call); its own parameters live on the meta device
        self.module = getattr(nn, mode)(input_size, hidden_size, device="meta", **settings)
        self.flat_weight_names = [name for name, _ in self.module.named_parameters()]  # torch's flat-weight order

    def fusable(self, maps: dict[str, list], input, hx, weight_dims: int) -> bool:
        """Whether the kernel can run these maps: all plain (no estimator intercepts them), weights with
        ``weight_dims`` dimensions, a ``(T, B, F)`` input (or a packed one) and an initial state without draws."""
        if not all(isinstance(m, AffineMap) and m.weight.dim() == weight_dims for ms in maps.values() for m in ms):
            return False
        if isinstance(input, torch.Tensor) and input.dim() != 3:
            return False
        return hx is None or all(h.dim() == 3 for h in (hx if isinstance(hx, tuple) else (hx,)))

    def fusable_draws(self, maps: dict[str, list], input, hx, num_draws: int) -> bool:
        """:meth:`fusable` for ``num_draws`` folded draws: plain maps whose weights are ``(S, 1, out, in)``."""
        if not self.fusable(maps, input, hx, weight_dims=4):
            return False
        return all(m.weight.shape[0] == num_draws for ms in maps.values() for m in ms)

    def call(self, maps: dict[str, list], input, hx, training: bool, pick=lambda t: t):
        """The kernel on ``input`` with the weights of ``maps`` (each passed through ``pick``)."""
        weights = {}
        for suffix, layer_maps in maps.items():
            for kind, m in zip(("ih", "hh", "hr"), layer_maps):
                weights[f"weight_{kind}{suffix}"] = pick(m.weight)
                if m.bias is not None:
                    weights[f"bias_{kind}{suffix}"] = pick(m.bias)
        if hx is None and isinstance(input, torch.Tensor):  # the common case: straight to torch's op
            return self.op([weights[name] for name in self.flat_weight_names], input, training=training)
        kernel = self.module.train(training)
        with warnings.catch_warnings():  # projections run without oneDNN (torch says so once per process)
            warnings.filterwarnings("ignore", message=_NO_ONEDNN)
            return functional_call(kernel, weights, (input,) if hx is None else (input, hx))

    def op(self, flat_weights: list[torch.Tensor], input: torch.Tensor, hx=None, *, training: bool):
        """torch's LSTM/GRU op on a ``(T, B, F)`` (``(B, T, F)``) tensor from ``hx`` or a zero state sized by the
        hidden-to-hidden weight: what ``torch.nn.LSTM.forward`` calls after its argument checks (which the layer has
        made), without the module call's overhead (a third of the time of a small layer's kernel call)."""
        if hx is None:
            batch = input.shape[0 if self.batch_first else 1]
            states = self.num_layers * self.num_directions
            weight_hh = flat_weights[1]  # torch's order: weight_ih, weight_hh, biases (, weight_hr)
            h0 = input.new_zeros(states, batch, weight_hh.shape[1])
            gates = 4 if self.mode == "LSTM" else 3
            hx = (h0, input.new_zeros(states, batch, weight_hh.shape[0] // gates)) if self.mode == "LSTM" else h0
        op = recurrent_kernel(self.mode)
        settings = (self.num_layers, self.dropout, training, self.bidirectional, self.batch_first)
        if not self.proj_size:
            output, *state = op(input, hx, flat_weights, self.has_biases, *settings)
            return output, (tuple(state) if self.mode == "LSTM" else state[0])
        with warnings.catch_warnings():  # projections run without oneDNN (torch says so once per process)
            warnings.filterwarnings("ignore", message=_NO_ONEDNN)
            output, *state = op(input, hx, flat_weights, self.has_biases, *settings)
        return output, (tuple(state) if self.mode == "LSTM" else state[0])

    def single(self, maps: dict[str, list], input, hx, training: bool):
        """The kernel with the drawn weights when a single plain draw serves every example; else ``None``."""
        return self.call(maps, input, hx, training) if self.fusable(maps, input, hx, weight_dims=2) else None

    def per_draw(self, maps: dict[str, list], input: torch.Tensor, hx, num_draws: int, batch_dim: int,
                 training: bool):
        """S folded draws of plain maps (weights ``(S, 1, out, in)``): the kernel once per draw on its block of
        rows -- the same computation as that draw run alone -- the outputs and states joined in the folded layout;
        else ``None``."""
        if not self.fusable_draws(maps, input, hx, num_draws):
            return None
        rows = input.shape[batch_dim] // num_draws
        outputs, states = [], []
        for s in range(num_draws):
            block = input.narrow(batch_dim, s * rows, rows)
            state = None if hx is None else map_state(self.mode, hx, lambda h, s=s: h.narrow(1, s * rows, rows))
            output, state = self.call(maps, block, state, training, pick=lambda t, s=s: t[s, 0])
            outputs.append(output)
            states.append(state)
        output = torch.cat(outputs, batch_dim)
        if self.mode == "LSTM":
            return output, tuple(torch.cat([state[i] for state in states], 1) for i in range(2))
        return output, torch.cat(states, 1)

    def grouped(self, maps: dict[str, list], input: torch.Tensor, hx, num_draws: int, batch_dim: int,
                training: bool):
        """S folded draws of plain maps without gradients (a vectorized ``predict``): the kernel once per group of G
        draws, each group one wider layer whose weights are the G draws on a block diagonal (gate-major rows, so
        every gate's slice holds the G draws side by side) -- the same arithmetic per draw, the zeros adding nothing,
        at a fraction of the kernel calls; an input shared by every draw (the data itself) is fed once. ``None``
        when it does not apply (gradients, projections, a group of one, a GRU: torch's GRU kernel at the wider size
        differs from the lone draw's in the 5th digit, which would trip predict's check of draw 0, while the LSTM's
        equals it bit for bit)."""
        group = min(num_draws, GROUPED_WIDTH // self.hidden_size)
        if self.mode != "LSTM" or torch.is_grad_enabled() or self.proj_size or group < 2:
            return None
        if not self.fusable_draws(maps, input, hx, num_draws):
            return None
        sequence = unfold_rows(input, num_draws, batch_dim).movedim(batch_dim, 0)  # (S, rows, T, F) or (S, T, ...)
        shared = bool((sequence == sequence[:1]).all())
        size, directions = self.hidden_size, self.num_directions
        outputs, states = [], []
        for start in range(0, num_draws, group):
            draws = slice(start, min(start + group, num_draws))
            count = draws.stop - draws.start
            block_input = sequence[0] if shared else sequence[draws].movedim(0, -2).flatten(-2)
            state = None if hx is None else tuple(unfold_rows(h, num_draws, 1)[:, draws].movedim(1, -2).flatten(-2)
                                                  for h in hx)
            output, state = self.op(self._grouped_weights(maps, draws, shared), block_input, state, training=training)
            outputs.append(output.unflatten(-1, (directions, count, size)).movedim(-2, 0).flatten(-2))
            states.append([h.unflatten(-1, (count, size)).movedim(-2, 1) for h in state])  # (L * D, G, rows, H)
        output = fold_rows(torch.cat(outputs).movedim(0, batch_dim), batch_dim)
        return output, tuple(fold_rows(torch.cat([state[i] for state in states], 1), 1) for i in range(2))

    def _grouped_weights(self, maps: dict[str, list], draws: slice, shared: bool) -> list[torch.Tensor]:
        """The flat weights (torch's order) of one wider LSTM holding ``draws`` on a block diagonal; with ``shared``
        the first layer's input weights are stacked for one input common to the draws."""
        size, weights = self.hidden_size, {}
        for suffix, layer_maps in maps.items():
            first_layer = suffix.startswith("_l0")
            for kind, m in zip(("ih", "hh"), layer_maps):
                weight = m.weight[draws, 0]  # (G, 4 * H, K)
                if kind == "ih" and first_layer and shared:  # the G draws stacked on one input
                    weight = weight.unflatten(1, (4, size)).transpose(0, 1).reshape(-1, weight.shape[-1])
                else:  # columns: an input's (directions, G, K) layout, as a wider layer's output has it
                    weight = _block_diagonal(weight, size, 1 if kind == "hh" or first_layer else self.num_directions)
                weights[f"weight_{kind}{suffix}"] = weight
                if m.bias is not None:
                    weights[f"bias_{kind}{suffix}"] = m.bias[draws, 0].unflatten(1, (4, size)).transpose(0, 1).flatten()
        return [weights[name] for name in self.flat_weight_names]

"""One recurrent layer's whole time loop as one autograd operation, with a hand-written backward through time.

With Flipout the recurrent weights cannot go through torch's fused LSTM/GRU kernel (every example has its own sign
vectors), so the layer runs its own time loop. Left to autograd, that loop records every step's products and gate
arithmetic and replays them one by one backward: six matrix products per step. :func:`recurrence` instead runs the
loop without recording, keeps the gate activations, and in its backward computes each step's gate gradients and
the state gradient (two products per step), then the weight gradients of *all* steps at once -- one product over
``T * B`` rows per weight, as cuDNN does. Gradients equal autograd's of the same loop (tested to float rounding).

Examples
--------
>>> B, T, H = 3, 5, 4
>>> projected = torch.randn(B, T, 4 * H)              # W_ih x_t + b_ih for every step
>>> weight = torch.randn(4 * H, H, requires_grad=True)
>>> output, (h_n, c_n) = recurrence("LSTM", projected, (torch.zeros(B, H), torch.zeros(B, H)), weight)
>>> output.shape, h_n.shape
(torch.Size([3, 5, 4]), torch.Size([3, 4]))
>>> output.sum().backward()
>>> weight.grad.shape
torch.Size([16, 4])
"""

from __future__ import annotations

import torch

__all__ = ["recurrence"]


def _hidden_product(h, weight, add, delta, bias_delta, sign_in, sign_out):
    """``add + h W^T + ((h * sign_in) D^T (+ db)) * sign_out`` (the perturbation only with a ``delta``)."""
    product = h @ weight.T if add is None else torch.addmm(add, h, weight.T)
    if delta is not None:
        perturbation = (h * sign_in) @ delta.T if bias_delta is None else torch.addmm(bias_delta, h * sign_in, delta.T)
        product = product.addcmul_(perturbation, sign_out)
    return product


def _state_gradient(grad, weight, delta, sign_in, sign_out):
    """The gradient of :func:`_hidden_product` with respect to ``h``."""
    grad_h = grad @ weight
    if delta is not None:
        grad_h = grad_h.addcmul_((grad * sign_out) @ delta, sign_in)
    return grad_h


class _Recurrence(torch.autograd.Function):
    """The loop forward without autograd's records; backward through time by hand (see the module docstring).

    Per-step tensors are kept in lists in processing order (freshly allocated tensors: on a CPU, writing into views
    of a preallocated buffer measured slower) and stacked once for the weight gradients.
    """

    @staticmethod
    def forward(ctx, mode, reverse, projected, h0, c0, weight, bias, delta, bias_delta, sign_in, sign_out):
        steps, size = projected.shape[1], h0.shape[-1]
        order = list(range(steps - 1, -1, -1) if reverse else range(steps))
        inputs = projected.unbind(1)
        h, c = h0, c0
        previous, saved, outputs = [], [], []  # the state each step starts from; what its backward needs
        for t in order:
            previous.append(h)
            if mode == "LSTM":
                gates = _hidden_product(h, weight, inputs[t] if bias is None else inputs[t] + bias, delta, bias_delta,
                                        sign_in, sign_out)
                act = gates.sigmoid()
                i, f, _, o = act.chunk(4, -1)
                cell = gates[:, 2 * size : 3 * size].tanh()
                c_previous = c
                c = torch.addcmul(f * c, i, cell)
                tc = c.tanh()
                h = o * tc
                saved.append((act, cell, c_previous, tc))
            else:
                hidden = _hidden_product(h, weight, bias, delta, bias_delta, sign_in, sign_out)
                x = inputs[t]
                rz = (x[:, : 2 * size] + hidden[:, : 2 * size]).sigmoid()
                r, z = rz.chunk(2, -1)
                hidden_n = hidden[:, 2 * size :]
                n = torch.addcmul(x[:, 2 * size :], r, hidden_n).tanh()
                h_previous = h
                h = torch.addcmul(n, z, h - n)
                saved.append((rz, n, hidden_n, h_previous))
            outputs.append(h)
        # intermediate tensors only (none of them is returned): kept on ctx without a reference cycle
        ctx.saved, ctx.previous = saved, previous
        ctx.save_for_backward(weight, delta, sign_in, sign_out)
        ctx.mode, ctx.order = mode, order
        ctx.has_bias, ctx.has_bias_delta = bias is not None, bias_delta is not None
        output = torch.stack(outputs[::-1] if reverse else outputs, 1)
        return (output, h, c) if mode == "LSTM" else (output, h)

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n=None):
        weight, delta, sign_in, sign_out = ctx.saved_tensors
        mode, saved, order = ctx.mode, ctx.saved, ctx.order
        steps, size = len(order), weight.shape[-1]
        grad_steps = grad_output.unbind(1)  # in time order
        grad_h, grad_c = grad_h_n, grad_c_n
        grad_inputs = [None] * steps  # by time index
        grad_hidden = [None] * steps  # by processing index
        for k in range(steps - 1, -1, -1):
            grad_h = grad_h + grad_steps[order[k]]
            if mode == "LSTM":
                act, cell, c_previous, tc = saved[k]
                i, f, _, o = act.chunk(4, -1)
                grad_c = torch.addcmul(grad_c, grad_h * o, 1 - tc * tc)
                d_act = act - act * act
                d_act[:, 2 * size : 3 * size] = 1 - cell * cell  # the cell input's tanh
                d = torch.cat([grad_c * cell, grad_c * c_previous, grad_c * i, grad_h * tc], -1).mul_(d_act)
                grad_inputs[order[k]] = grad_hidden[k] = d
                grad_c = grad_c * f
                grad_h = _state_gradient(d, weight, delta, sign_in, sign_out)
            else:
                rz, n, hidden_n, h_previous = saved[k]
                r, z = rz.chunk(2, -1)
                grad_n = grad_h * (1 - z) * (1 - n * n)  # through n = tanh(x_n + r * hidden_n)
                d_rz = torch.cat([grad_n * hidden_n, grad_h * (h_previous - n)], -1).mul_(rz - rz * rz)
                grad_inputs[order[k]] = torch.cat([d_rz, grad_n], -1)
                grad_hidden[k] = d = torch.cat([d_rz, grad_n * r], -1)
                grad_h = torch.addcmul(_state_gradient(d, weight, delta, sign_in, sign_out), grad_h, z)
        # every step's weight gradients in one product over the T * B rows
        gates = grad_hidden[0].shape[-1]
        flat = torch.stack(grad_hidden).reshape(-1, gates)
        previous = torch.stack(ctx.previous).reshape(-1, size)
        grad_weight = flat.T @ previous
        grad_bias = flat.sum(0) if ctx.has_bias else None
        grad_delta = grad_bias_delta = None
        if delta is not None:
            signed = (flat.view(steps, -1, gates) * sign_out).reshape(-1, gates)
            grad_delta = signed.T @ (previous.view(steps, -1, size) * sign_in).reshape(-1, size)
            grad_bias_delta = signed.sum(0) if ctx.has_bias_delta else None
        return (None, None, torch.stack(grad_inputs, 1), grad_h, grad_c if mode == "LSTM" else None, grad_weight,
                grad_bias, grad_delta, grad_bias_delta, None, None)


def recurrence(
    mode: str,
    projected: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    delta: torch.Tensor | None = None,
    bias_delta: torch.Tensor | None = None,
    sign_in: torch.Tensor | None = None,
    sign_out: torch.Tensor | None = None,
    reverse: bool = False,
):
    """Run one LSTM or GRU layer (one direction) over a whole sequence whose input projection is done.

    Parameters
    ----------
    mode : {"LSTM", "GRU"}
        The cell, with torch's gate order (``i, f, g, o`` and ``r, z, n``).
    projected : Tensor
        ``(B, T, G)``: ``W_ih x_t + b_ih`` for every step (``G = 4H`` or ``3H``), Flipout's perturbation included.
    state : (Tensor, Tensor) or Tensor
        The initial ``(h_0, c_0)`` of an LSTM or ``h_0`` of a GRU, each ``(B, H)``.
    weight, bias : Tensor
        The hidden-to-hidden weight ``(G, H)`` and bias ``(G,)``: the drawn ones, or Flipout's posterior means.
    delta, bias_delta, sign_in, sign_out : Tensor, optional
        Flipout's perturbation ``W - loc`` (and of the bias) and its sign vectors ``(B, H)``, ``(B, G)``.
    reverse : bool
        Run from the last step to the first (a bidirectional layer's second direction).

    Returns
    -------
    output : Tensor
        ``(B, T, H)``, every step's hidden state in time order.
    final : (Tensor, Tensor) or Tensor
        The last processed step's ``(h, c)`` (LSTM) or ``h`` (GRU).

    Examples
    --------
    >>> B, T, H = 2, 3, 4
    >>> output, h_n = recurrence("GRU", torch.randn(B, T, 3 * H), torch.zeros(B, H), torch.randn(3 * H, H))
    >>> output.shape, torch.equal(output[:, -1], h_n)
    (torch.Size([2, 3, 4]), True)
    """
    if mode not in ("LSTM", "GRU"):
        raise ValueError(f"recurrence: mode must be 'LSTM' or 'GRU', got {mode!r}.")
    h0, c0 = state if mode == "LSTM" else (state, None)
    output, *final = _Recurrence.apply(mode, reverse, projected, h0, c0, weight, bias, delta, bias_delta, sign_in,
                                       sign_out)
    return output, (tuple(final) if mode == "LSTM" else final[0])

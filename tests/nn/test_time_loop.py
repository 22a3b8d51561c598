"""The whole-sequence recurrence with its hand-written backward through time, against autograd of the plain loop."""

import pyro
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianGRU, BayesianLSTM
from pyro_bbb.nn._time_loop import recurrence

GATES = {"LSTM": 4, "GRU": 3}


def plain_loop(mode, projected, state, weight, bias, delta, bias_delta, sign_in, sign_out, reverse):
    """The textbook cell equations, step by step (autograd's reference)."""
    steps = projected.shape[1]
    h, c = state if mode == "LSTM" else (state, None)
    outputs = [None] * steps
    for t in reversed(range(steps)) if reverse else range(steps):
        hidden = h @ weight.T + (0 if bias is None else bias)
        if delta is not None:
            hidden = hidden + ((h * sign_in) @ delta.T + (0 if bias_delta is None else bias_delta)) * sign_out
        x = projected[:, t]
        if mode == "LSTM":
            i, f, g, o = (x + hidden).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            (xr, xz, xn), (hr, hz, hn) = x.chunk(3, -1), hidden.chunk(3, -1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            n = torch.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
        outputs[t] = h
    return torch.stack(outputs, 1), ((h, c) if mode == "LSTM" else h)


def random_signs(*shape):
    return torch.randint(0, 2, shape, dtype=torch.float64) * 2 - 1


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("flipout", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_and_every_gradient_equal_autograd_of_the_plain_loop(mode, flipout, reverse, bias):
    torch.manual_seed(0)
    batch, steps, size = 5, 7, 3
    gates = GATES[mode] * size

    def leaf(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    projected, h0, c0, weight = leaf(batch, steps, gates), leaf(batch, size), leaf(batch, size), leaf(gates, size)
    b = leaf(gates) if bias else None
    delta = leaf(gates, size) if flipout else None
    bias_delta = leaf(gates) if flipout and bias else None
    signs = (random_signs(batch, size), random_signs(batch, gates)) if flipout else (None, None)
    state = (h0, c0) if mode == "LSTM" else h0
    leaves = [t for t in (projected, h0, c0 if mode == "LSTM" else None, weight, b, delta, bias_delta) if t is not None]
    ours = recurrence(mode, projected, state, weight, b, delta, bias_delta, *signs, reverse=reverse)
    reference = plain_loop(mode, projected, state, weight, b, delta, bias_delta, *signs, reverse)
    flat_ours = [ours[0], *(ours[1] if mode == "LSTM" else (ours[1],))]
    flat_reference = [reference[0], *(reference[1] if mode == "LSTM" else (reference[1],))]
    cotangents = [torch.randn_like(t) for t in flat_ours]
    for got, expected in zip(flat_ours, flat_reference):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(flat_ours, leaves, cotangents)
    expected = torch.autograd.grad(flat_reference, leaves, cotangents)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_gradcheck_with_flipout(mode):
    torch.manual_seed(1)
    batch, steps, size = 2, 3, 2
    gates = GATES[mode] * size
    projected = torch.randn(batch, steps, gates, dtype=torch.float64, requires_grad=True)
    weight, delta = (torch.randn(gates, size, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bias = torch.randn(gates, dtype=torch.float64, requires_grad=True)
    signs = random_signs(batch, size), random_signs(batch, gates)
    h0 = torch.randn(batch, size, dtype=torch.float64, requires_grad=True)
    state = (h0, torch.zeros_like(h0)) if mode == "LSTM" else h0

    def run(projected, weight, delta, bias, h0):
        state = (h0, torch.zeros_like(h0)) if mode == "LSTM" else h0
        return recurrence(mode, projected, state, weight, bias, delta, None, *signs)[0]

    assert state is not None
    assert torch.autograd.gradcheck(run, (projected, weight, delta, bias, h0))


def test_retained_graph_backward_twice_gives_the_same_gradients():
    torch.manual_seed(2)
    projected = torch.randn(3, 4, 8, requires_grad=True)
    weight = torch.randn(8, 2, requires_grad=True)
    output, _ = recurrence("LSTM", projected, (torch.zeros(3, 2), torch.zeros(3, 2)), weight)
    first = torch.autograd.grad(output.sum(), weight, retain_graph=True)[0]
    second = torch.autograd.grad(output.sum(), weight)[0]
    torch.testing.assert_close(first, second)


def test_unknown_mode_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match="'LSTM' or 'GRU'"):
        recurrence("RNN", torch.zeros(1, 1, 4), torch.zeros(1, 1), torch.zeros(4, 1))


@pytest.mark.parametrize("layer", [BayesianLSTM, BayesianGRU])
def test_flipout_layer_equals_its_step_by_step_loop(layer):
    """Under Flipout a layer runs its time loop through ``recurrence``; a packed batch whose sequences all have full
    length runs the step-by-step loop (with its length masks) on the same signs: same loss, same gradients."""
    torch.manual_seed(3)
    x, y = torch.randn(6, 5, 3), torch.randn(6, 1)

    class LastStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = layer(3, 4, num_layers=2, bidirectional=True, batch_first=True)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x, lengths=None):
            if lengths is not None:  # through a packed sequence
                packed = pack_padded_sequence(x, lengths, batch_first=True)
                output, _ = self.rnn(packed)
                return self.head(torch.nn.utils.rnn.pad_packed_sequence(output, batch_first=True)[0][:, -1])
            return self.head(self.rnn(x)[0][:, -1])

    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(LastStep(), likelihoods.Gaussian(0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.3)
    elbo = pyro_bbb.ELBO(num_data=60)
    results = []
    for inputs in (x, (x, torch.full((6,), 5))):
        torch.manual_seed(4)
        with pyro_bbb.flipout():
            loss = elbo.differentiable_loss(bnn, guide, inputs, y)
        params = [p for _, p in sorted(pyro.get_param_store().named_parameters())]
        results.append((loss, torch.autograd.grad(loss, params)))
    (loss_whole, grads_whole), (loss_loop, grads_loop) = results
    torch.testing.assert_close(loss_whole, loss_loop, rtol=1e-5, atol=1e-5)
    for whole, loop in zip(grads_whole, grads_loop):
        torch.testing.assert_close(whole, loop, rtol=1e-4, atol=1e-5)

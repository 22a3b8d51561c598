"""Linear and convolution operations that accept weights with leading sample dimensions.

Under ``Predictive(parallel=True)`` or ``vectorize_particles=True`` a Bayesian layer receives weights of shape
``(*sample_dims, out, in)`` (e.g. ``(S, 1, out, in)``). The sample dimensions line up, right-aligned, with the
input's batch dimensions (everything left of the feature or channel dimension), exactly as Pyro's plates line up:
a weight of shape ``(S, 1, out, in)`` applied to an input of shape ``(B, in)`` gives ``(S, B, out)``. Weights are
global, so their sample dimensions never line up with the data dimension: a weight of shape ``(S, out, in)`` is
read as ``(S, 1, out, in)``. All S draws are computed in one batched kernel call; nothing loops over samples.

Examples
--------
>>> w = torch.randn(10, 1, 4, 3)
>>> batched_linear(torch.randn(32, 3), w).shape
torch.Size([10, 32, 4])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import effectful

__all__ = ["batched_linear", "batched_conv", "bayesian_affine", "bayesian_affine_map", "AffineMap", "FlipoutMap"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _global(param: torch.Tensor | None, param_dims: int) -> torch.Tensor | None:
    """Give a parameter with sample dims a singleton in the data position: ``(S, *p)`` -> ``(S, 1, *p)``."""
    if param is None or param.dim() <= param_dims or param.shape[-param_dims - 1] == 1:
        return param
    return param.unsqueeze(-param_dims - 1)


def batched_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` where ``weight`` (``(*S, out, in)``) and ``bias`` (``(*S, out)``) may carry sample dims.

    Examples
    --------
    >>> batched_linear(torch.randn(5, 3), torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4)).shape
    torch.Size([2, 5, 4])
    """
    weight, bias = _global(weight, 2), _global(bias, 1)
    if weight.dim() == 2:
        if bias is None or bias.dim() == 1:
            return F.linear(input, weight, bias)
        output = F.linear(input, weight)
    elif input.dim() == 2 and weight.shape[-3] == 1:
        # input (B, in) shared by all draws (*S, 1, out, in): one matrix product against every draw's weights
        lead, (out_features, in_features) = weight.shape[:-3], weight.shape[-2:]
        output = input @ weight.reshape(-1, in_features).T  # (B, S * out)
        output = output.reshape((input.shape[0], *lead, out_features)).movedim(0, -2)
    else:
        # einsum treats a size-1 dimension of one operand as belonging to the other operand only, so the
        # S draws become one batched matmul without materialising the broadcast weight.
        output = torch.einsum("...i,...oi->...o", input, weight)
    return output if bias is None else output + bias


def batched_conv(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    spatial_dims: int,
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
    groups: int,
    transposed: bool = False,
    output_padding: Sequence[int] = 0,
) -> torch.Tensor:
    """``F.conv{1,2,3}d`` (or, with ``transposed=True``, ``F.conv_transpose{1,2,3}d``) where ``weight`` may carry
    sample dims: ``(*S, out, in/groups, *kernel)`` (transposed: ``(*S, in, out/groups, *kernel)``).

    The input is ``(*batch, C, *spatial)``; weight sample dims broadcast against ``batch`` right-aligned.
    The S draws are folded into the channel dimension and run as one grouped convolution (a transposed
    convolution's groups split its input channels the same way, so the same folding applies).

    Examples
    --------
    >>> x = torch.randn(8, 3, 16, 16)
    >>> w = torch.randn(5, 1, 6, 3, 3, 3)
    >>> batched_conv(x, w, None, spatial_dims=2, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1).shape
    torch.Size([5, 8, 6, 16, 16])
    >>> w = torch.randn(5, 1, 3, 6, 2, 2)                     # transposed: (S, 1, in, out, kH, kW)
    >>> batched_conv(x, w, None, spatial_dims=2, stride=(2, 2), padding=(0, 0), dilation=(1, 1), groups=1,
    ...              transposed=True).shape
    torch.Size([5, 8, 6, 32, 32])
    """
    if transposed:
        transpose = _CONV_TRANSPOSE[spatial_dims]

        def conv(x, w, b, groups_):
            return transpose(x, w, b, stride, padding, output_padding, groups_, dilation)
    else:
        plain = _CONV[spatial_dims]

        def conv(x, w, b, groups_):
            return plain(x, w, b, stride, padding, dilation, groups_)

    kernel_dims = spatial_dims + 2
    weight, bias = _global(weight, kernel_dims), _global(bias, 1)
    if bias is not None and bias.dim() > 1:  # bias draws: added after the convolution, broadcast over positions
        out = batched_conv(input, weight, None, spatial_dims=spatial_dims, stride=stride, padding=padding,
                           dilation=dilation, groups=groups, transposed=transposed,
                           output_padding=output_padding)
        return out + bias.reshape(bias.shape + (1,) * spatial_dims)
    if weight.dim() == kernel_dims and (bias is None or bias.dim() == 1):
        if input.dim() <= spatial_dims + 2:
            return conv(input, weight, bias, groups)
        # plain weights, extra leading batch dims on the input: fold them into the batch.
        lead = input.shape[: -(spatial_dims + 1)]
        flat = input.reshape((-1,) + input.shape[-(spatial_dims + 1) :])
        out = conv(flat, weight, bias, groups)
        return out.reshape(lead + out.shape[1:])

    weight_batch = weight.shape[:-kernel_dims]
    input_batch = input.shape[: -(spatial_dims + 1)]
    if input.device.type == "cpu" and len(weight_batch) == 2 and weight_batch[1] == 1 and len(input_batch) == 2 \
            and input_batch[0] == weight_batch[0] and (bias is None or bias.dim() == 1):
        # one draw per block of examples (folded draws, Flipout's perturbation): on a CPU one convolution per draw,
        # written into one output, is faster than the grouped convolution below (benchmarks/predict.py measures both)
        first = conv(input[0], weight[0, 0], bias, groups)
        out = first.new_empty((input_batch[0], *first.shape))
        out[0] = first
        for s in range(1, input_batch[0]):
            out[s] = conv(input[s], weight[s, 0], bias, groups)
        return out

    full = torch.broadcast_shapes(weight_batch, input_batch)
    n = len(full)
    w_batch = (1,) * (n - len(weight_batch)) + tuple(weight_batch)
    group_dims = [d for d in range(n) if w_batch[d] != 1]
    shared_dims = [d for d in range(n) if w_batch[d] == 1]
    num_groups = math.prod(full[d] for d in group_dims)
    channels = input.shape[-(spatial_dims + 1)]

    feature_shape = tuple(input.shape[-(spatial_dims + 1) :])
    x = input.reshape((1,) * (n - len(input_batch)) + tuple(input.shape)).expand(tuple(full) + feature_shape)
    feature_axes = list(range(n, n + spatial_dims + 1))
    x = x.permute(shared_dims + group_dims + feature_axes)
    x = x.reshape((-1, num_groups * channels) + tuple(input.shape[-spatial_dims:]))
    w = weight.reshape((num_groups * weight.shape[-kernel_dims],) + tuple(weight.shape[-(kernel_dims - 1) :]))
    b = None if bias is None else bias.repeat(num_groups)  # here a bias has no draws of its own
    y = conv(x, w, b, groups * num_groups)
    out_channels, out_spatial = y.shape[1] // num_groups, tuple(y.shape[2:])
    y = y.reshape([full[d] for d in shared_dims] + [full[d] for d in group_dims] + [out_channels, *out_spatial])
    inverse = [0] * n
    for position, d in enumerate(shared_dims + group_dims):
        inverse[d] = position
    return y.permute(inverse + list(range(n, n + spatial_dims + 1)))


def _affine(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    apply: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    feature_dims: int,
    weight_site: str | None = None,
    bias_site: str | None = None,
    draw: torch.Tensor | None = None,
    examples: tuple[torch.Size, torch.Size] | None = None,
) -> torch.Tensor:
    return apply(input, weight, bias)


#: The operation every Bayesian layer runs: ``apply(input, weight, bias)`` where ``apply`` is linear in the weight
#: (:func:`batched_linear`, or :func:`batched_conv` with the layer's settings). It is a Pyro effectful operation of
#: type ``"bayesian_affine"``: outside any handler it is exactly ``apply(input, weight, bias)``; the estimators in
#: :mod:`pyro_bbb.infer.estimators` intercept it (``feature_dims`` is how many trailing dimensions describe one example:
#: 1 for linear, 1 + spatial dims for convolutions; ``weight_site`` / ``bias_site`` name the sample sites; ``draw`` is
#: the weight site's draw itself, when ``weight`` is a view made of it for folded draws; ``examples`` is where
#: per-example draws go, from :func:`pyro_bbb._draws.example_draw_shape`).
bayesian_affine = effectful(_affine, type="bayesian_affine")


def sample_dims(weight: torch.Tensor, feature_dims: int) -> torch.Size:
    """The leading sample dimensions of a weight, read with the global-weight rule (``(S, *p)`` -> ``(S, 1)``).

    Examples
    --------
    >>> sample_dims(torch.zeros(7, 4, 3), feature_dims=1), sample_dims(torch.zeros(4, 3), feature_dims=1)
    (torch.Size([7, 1]), torch.Size([]))
    """
    param_dims = feature_dims + 1
    return _global(weight, param_dims).shape[:-param_dims]


def with_time_dims(param: torch.Tensor | None, param_dims: int, time_dims: int) -> torch.Tensor | None:
    """A parameter with draw dimensions, given ``time_dims`` more singleton batch dimensions on the right, so that
    it applies to inputs with extra per-example dimensions (time steps): ``(S, 1, out, in)`` -> ``(S, 1, 1, out, in)``.

    Examples
    --------
    >>> with_time_dims(torch.zeros(5, 1, 4, 3), param_dims=2, time_dims=1).shape
    torch.Size([5, 1, 1, 4, 3])
    """
    if param is None or param.dim() <= param_dims or time_dims == 0:
        return param
    param = _global(param, param_dims)
    return param.reshape(param.shape[:-param_dims] + (1,) * time_dims + param.shape[-param_dims:])


class AffineMap:
    """The plain map ``input -> apply(input, weight, bias)`` that :data:`bayesian_affine_map` returns when no
    estimator intercepts it. It keeps the ``weight`` and ``bias`` it was made from, so that a recurrent layer whose
    maps are all plain (reparameterization, one draw) can hand them to torch's fused kernel instead.

    Examples
    --------
    >>> m = AffineMap(torch.eye(2), None, apply=batched_linear)
    >>> m(torch.ones(3, 2)).shape, m.weight.shape
    (torch.Size([3, 2]), torch.Size([2, 2]))
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *,
                 apply: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
                 param_dims: int = 2, time_dims: int = 0):
        self.weight, self.bias, self.apply = weight, bias, apply
        self._weight, self._bias = with_time_dims(weight, param_dims, time_dims), with_time_dims(bias, 1, time_dims)

    def __call__(self, input: torch.Tensor) -> torch.Tensor:
        return self.apply(input, self._weight, self._bias)


class FlipoutMap:
    """The map ``input -> apply(input, loc, bias_loc) + (apply(input * sign_in, delta, bias_delta)) * sign_out`` that
    :func:`pyro_bbb.flipout` returns for :data:`bayesian_affine_map`: the posterior mean's product plus the drawn
    perturbation ``delta = W - loc`` (and ``bias_delta``) with random signs per example, drawn once per sequence.
    It keeps its parts, so that a recurrent layer can run its whole time loop in one kernel
    (:mod:`pyro_bbb.nn._time_loop`).

    Examples
    --------
    >>> signs_in, signs_out = torch.ones(3, 2), -torch.ones(3, 2)
    >>> m = FlipoutMap(torch.eye(2), None, torch.eye(2), None, signs_in, signs_out, apply=batched_linear)
    >>> m(torch.ones(3, 2))   # loc's product plus the perturbation's, its sign flipped
    tensor([[0., 0.],
            [0., 0.],
            [0., 0.]])
    """

    def __init__(self, loc: torch.Tensor, bias_loc: torch.Tensor | None, delta: torch.Tensor,
                 bias_delta: torch.Tensor | None, sign_in: torch.Tensor, sign_out: torch.Tensor, *,
                 apply: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
                 time_dims: int = 0):
        self.loc, self.bias_loc, self.delta, self.bias_delta = loc, bias_loc, delta, bias_delta
        self.sign_in, self.sign_out, self.apply = sign_in, sign_out, apply
        self._delta, self._bias_delta = with_time_dims(delta, 2, time_dims), with_time_dims(bias_delta, 1, time_dims)

    def __call__(self, input: torch.Tensor) -> torch.Tensor:
        perturbation = self.apply(input * self.sign_in, self._delta, self._bias_delta)
        return torch.addcmul(self.apply(input, self.loc, self.bias_loc), perturbation, self.sign_out)


def _affine_map(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    apply: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    feature_dims: int,
    example_shape: tuple[int, ...],
    time_dims: int = 0,
    weight_site: str | None = None,
    bias_site: str | None = None,
    draw: torch.Tensor | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    return AffineMap(weight, bias, apply=apply, param_dims=feature_dims + 1, time_dims=time_dims)


#: The operation a recurrent layer runs once per sequence: it returns the map ``input -> apply(input, weight,
#: bias)`` that the layer then applies to the whole sequence (inputs with ``time_dims`` extra per-example
#: dimensions) or at every time step, without re-entering Pyro. Effectful (type ``"bayesian_affine_map"``) so that
#: :func:`pyro_bbb.flipout` can return a map whose random signs are drawn once per example (``example_shape``) and
#: shared by all time steps (``draw``: the weight site's draw itself, as for :data:`bayesian_affine`).
bayesian_affine_map = effectful(_affine_map, type="bayesian_affine_map")

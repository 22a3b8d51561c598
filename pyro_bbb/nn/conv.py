"""``BayesianConv1d/2d/3d`` and ``BayesianConvTranspose1d/2d/3d``: the Bayes-by-Backprop twins of
:class:`torch.nn.Conv1d/2d/3d` and :class:`torch.nn.ConvTranspose1d/2d/3d`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .._internals import ConvNd, ConvTransposeNd
from ..priors import Prior
from .functional import batched_conv
from .module import BayesianModule

__all__ = [
    "BayesianConv1d", "BayesianConv2d", "BayesianConv3d",
    "BayesianConvTranspose1d", "BayesianConvTranspose2d", "BayesianConvTranspose3d",
]

_Size = int | tuple[int, ...]


class _ConvLayer(BayesianModule):
    """What the (transposed) convolutions share: the input check, torch's repr, and ``reset_parameters`` through
    the torch twin (built from :meth:`_twin_arguments`)."""

    _twin_class: type[ConvNd]
    _spatial_dims: int

    def _twin_arguments(self) -> tuple:
        """The twin's positional constructor arguments for this layer's settings."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """Redraw the initial values the way the torch twin's ``reset_parameters`` does."""
        twin = self._twin_class(*self._twin_arguments(), device=self.weight_init.device, dtype=self.weight_init.dtype)
        for name, param in twin.named_parameters():
            self.set_initial_value(name, param)

    def _check_channels(self, input: torch.Tensor) -> None:
        d = self._spatial_dims
        if input.dim() < d + 1 or input.shape[-(d + 1)] != self.in_channels:
            raise ValueError(
                f"{type(self).__name__}(in_channels={self.in_channels}) expects input of shape "
                f"(*batch, {self.in_channels}, {', '.join('L' + str(i) for i in range(d))}), "
                f"got {tuple(input.shape)}."
            )

    def extra_repr(self) -> str:
        """torch's repr of the settings (non-defaults only), then the prior."""
        d = self._spatial_dims
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        defaults = {"padding": (0,) * d, "dilation": (1,) * d, "output_padding": (0,) * d, "groups": 1}
        for name, default in defaults.items():
            value = getattr(self, name, default)
            if value != default:
                s += f", {name}={value}"
        if "bias" not in self._bayesian:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return f"{s}, {self._prior_repr()}"


class _BayesianConvNd(_ConvLayer):
    """Shared implementation of the N-d Bayesian convolutions (see :class:`BayesianConv2d`)."""

    _twin_class: type[ConvNd]
    _spatial_dims: int

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _Size,
        stride: _Size = 1,
        padding: _Size | str = 0,
        dilation: _Size = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        prior: Prior | None = None,
    ):
        super().__init__(prior)
        # The torch twin validates and normalises the arguments and draws the initial values.
        twin = self._twin_class(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
            device=device, dtype=dtype,
        )
        for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                     "padding_mode", "_reversed_padding_repeated_twice"):
            setattr(self, attr, getattr(twin, attr))
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self._declare_bayesian("weight", twin.weight, fan_in=fan_in)
        self._declare_bayesian("bias", twin.bias, fan_in=fan_in)

    def _twin_arguments(self) -> tuple:
        return (self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding, self.dilation,
                self.groups, "bias" in self._bayesian, self.padding_mode)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = self._spatial_dims
        self._check_channels(input)
        padding = self.padding
        if self.padding_mode != "zeros":
            features = input.shape[-(d + 1) :]
            flat = F.pad(input.reshape((-1, *features)), self._reversed_padding_repeated_twice, mode=self.padding_mode)
            input = flat.reshape(input.shape[: -(d + 1)] + flat.shape[1:])
            padding = (0,) * d
        apply = partial(batched_conv, spatial_dims=d, stride=self.stride, padding=padding, dilation=self.dilation,
                        groups=self.groups)
        return self._affine(input, apply, feature_dims=d + 1)


class BayesianConv1d(_BayesianConvNd):
    """Bayesian twin of :class:`torch.nn.Conv1d`; see :class:`BayesianConv2d`.

    Examples
    --------
    >>> BayesianConv1d(4, 8, 3, padding=1)(torch.randn(2, 4, 10)).shape
    torch.Size([2, 8, 10])
    """

    _twin_class = nn.Conv1d
    _spatial_dims = 1


class BayesianConv2d(_BayesianConvNd):
    """A 2-d convolution whose ``weight`` and ``bias`` are sample sites with a prior.

    Same constructor (plus ``prior``), shapes and output as :class:`torch.nn.Conv2d`; weights with leading
    sample dimensions ``(*S, out, in/groups, kH, kW)`` run as one grouped convolution over all S draws, and the
    output gets the sample dimensions in front: input ``(N, C, H, W)`` and weight ``(S, 1, ...)`` give
    ``(S, N, out, H', W')``.

    Examples
    --------
    >>> conv = BayesianConv2d(3, 6, kernel_size=3, padding=1, prior=priors.FanInNormal())
    >>> conv
    BayesianConv2d(3, 6, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), prior=FanInNormal(gain=1.0))
    >>> conv(torch.randn(2, 3, 8, 8)).shape
    torch.Size([2, 6, 8, 8])
    """

    _twin_class = nn.Conv2d
    _spatial_dims = 2


class BayesianConv3d(_BayesianConvNd):
    """Bayesian twin of :class:`torch.nn.Conv3d`; see :class:`BayesianConv2d`.

    Examples
    --------
    >>> BayesianConv3d(1, 2, 3)(torch.randn(1, 1, 5, 5, 5)).shape
    torch.Size([1, 2, 3, 3, 3])
    """

    _twin_class = nn.Conv3d
    _spatial_dims = 3


class _BayesianConvTransposeNd(_ConvLayer):
    """Shared implementation of the N-d Bayesian transposed convolutions (see :class:`BayesianConvTranspose2d`)."""

    #: Its weight is ``(in_channels, out_channels / groups, *kernel)``, as torch's twin's (and its ``transposed``)
    transposed = True
    _twin_class: type[ConvTransposeNd]
    _spatial_dims: int

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _Size,
        stride: _Size = 1,
        padding: _Size = 0,
        output_padding: _Size = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: _Size = 1,
        padding_mode: str = "zeros",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        prior: Prior | None = None,
    ):
        super().__init__(prior)
        # The torch twin validates the arguments (e.g. only zero padding) and draws the initial values.
        twin = self._twin_class(
            in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation,
            padding_mode, device=device, dtype=dtype,
        )
        if any(p >= max(s, d) for p, s, d in zip(twin.output_padding, twin.stride, twin.dilation)):
            # torch only finds out at the first forward
            raise ValueError(
                f"output padding must be smaller than either stride or dilation, got output_padding="
                f"{twin.output_padding}, stride={twin.stride}, dilation={twin.dilation}."
            )
        for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding", "groups",
                     "dilation", "padding_mode"):
            setattr(self, attr, getattr(twin, attr))
        # Each output position sums in_channels/groups * prod(kernel) / prod(stride) weighted inputs on average.
        fan_in = max(1, round(in_channels // groups * math.prod(self.kernel_size) / math.prod(self.stride)))
        self._declare_bayesian("weight", twin.weight, fan_in=fan_in)
        self._declare_bayesian("bias", twin.bias, fan_in=fan_in)

    def _twin_arguments(self) -> tuple:
        return (self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding, self.output_padding,
                self.groups, "bias" in self._bayesian, self.dilation, self.padding_mode)

    def output_padding_for(self, input: torch.Tensor, output_size: Sequence[int] | None) -> tuple[int, ...]:
        """The ``output_padding`` that gives the requested ``output_size`` (its last ``spatial_dims`` entries are
        the spatial sizes), as ``torch.nn.ConvTranspose*d`` computes it; the layer's own without ``output_size``.

        Examples
        --------
        >>> up = BayesianConvTranspose1d(2, 2, 3, stride=2)
        >>> up.output_padding_for(torch.zeros(1, 2, 5), output_size=[12])
        (1,)
        """
        if output_size is None:
            return self.output_padding
        d = self._spatial_dims
        if len(output_size) not in (d, d + 2):  # (as torch: the spatial sizes, or the whole output shape)
            raise ValueError(f"output_size must have {d} or {d + 2} elements (got {len(output_size)}).")
        output_size = [int(s) for s in output_size][-d:]
        padding = []
        for i, size in enumerate(output_size):
            length = input.shape[-d + i]
            span = self.dilation[i] * (self.kernel_size[i] - 1) + 1
            smallest = (length - 1) * self.stride[i] - 2 * self.padding[i] + span
            largest = smallest + self.stride[i] - 1
            if not smallest <= size <= largest:
                raise ValueError(
                    f"requested an output size of {output_size}, but valid sizes for an input of spatial size "
                    f"{tuple(input.shape[-d:])} range from {smallest} to {largest} in dimension {i} "
                    f"(for an input of shape {tuple(input.shape)})."
                )
            padding.append(size - smallest)
        return tuple(padding)

    def forward(self, input: torch.Tensor, output_size: Sequence[int] | None = None) -> torch.Tensor:
        self._check_channels(input)
        apply = partial(batched_conv, spatial_dims=self._spatial_dims, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups, transposed=True,
                        output_padding=self.output_padding_for(input, output_size))
        return self._affine(input, apply, feature_dims=self._spatial_dims + 1)


class BayesianConvTranspose1d(_BayesianConvTransposeNd):
    """Bayesian twin of :class:`torch.nn.ConvTranspose1d`; see :class:`BayesianConvTranspose2d`.

    Examples
    --------
    >>> BayesianConvTranspose1d(4, 2, 3, stride=2)(torch.randn(2, 4, 10)).shape
    torch.Size([2, 2, 21])
    """

    _twin_class = nn.ConvTranspose1d
    _spatial_dims = 1


class BayesianConvTranspose2d(_BayesianConvTransposeNd):
    """A 2-d transposed convolution whose ``weight`` and ``bias`` are sample sites with a prior.

    Same constructor (plus ``prior``), weight shape ``(in, out/groups, kH, kW)``, forward (including
    ``output_size``) and output as :class:`torch.nn.ConvTranspose2d`. Weights with leading sample dimensions run as
    one grouped transposed convolution over all draws; Flipout and local reparameterization apply unchanged (a
    transposed convolution is linear in its weight, and each weight meets an output position at most once, so
    local reparameterization's per-position marginals are exact). The prior's fan-in (for
    :class:`~pyro_bbb.priors.FanInNormal`) is the average number of weighted inputs of an output position,
    ``in/groups * kH * kW / (sH * sW)``.

    Examples
    --------
    >>> up = BayesianConvTranspose2d(8, 3, kernel_size=3, stride=2, padding=1, output_padding=1)
    >>> up
    BayesianConvTranspose2d(8, 3, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1), \
prior=FanInNormal(gain=1.4142135623730951, bias_scale=1.0))
    >>> up(torch.randn(2, 8, 4, 4)).shape
    torch.Size([2, 3, 8, 8])
    >>> up(torch.randn(2, 8, 4, 4), output_size=[7, 7]).shape
    torch.Size([2, 3, 7, 7])
    """

    _twin_class = nn.ConvTranspose2d
    _spatial_dims = 2


class BayesianConvTranspose3d(_BayesianConvTransposeNd):
    """Bayesian twin of :class:`torch.nn.ConvTranspose3d`; see :class:`BayesianConvTranspose2d`.

    Examples
    --------
    >>> BayesianConvTranspose3d(2, 1, 2, stride=2)(torch.randn(1, 2, 3, 3, 3)).shape
    torch.Size([1, 1, 6, 6, 6])
    """

    _twin_class = nn.ConvTranspose3d
    _spatial_dims = 3

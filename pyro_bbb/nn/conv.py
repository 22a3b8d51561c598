"""``BayesianConv1d/2d/3d``: the Bayes-by-Backprop twins of :class:`torch.nn.Conv1d/2d/3d`."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ..priors import Prior
from .functional import batched_conv
from .module import BayesianModule

__all__ = ["BayesianConv1d", "BayesianConv2d", "BayesianConv3d"]

_Size = int | tuple[int, ...]


class _BayesianConvNd(BayesianModule):
    """Shared implementation of the N-d Bayesian convolutions (see :class:`BayesianConv2d`)."""

    _twin_class: type[nn.modules.conv._ConvNd]
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
        prior: Prior | None = None,
        padding_mode: str = "zeros",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(prior)
        # The torch twin validates and normalises the arguments and draws the initial values.
        twin = self._twin_class(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
            device=device, dtype=dtype,
        )  # fmt: skip
        for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                     "padding_mode", "_reversed_padding_repeated_twice"):  # fmt: skip
            setattr(self, attr, getattr(twin, attr))
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self._declare_bayesian("weight", twin.weight, fan_in=fan_in)
        self._declare_bayesian("bias", twin.bias, fan_in=fan_in)

    def reset_parameters(self) -> None:
        """Redraw the initial values the way the torch twin's ``reset_parameters`` does."""
        twin = self._twin_class(
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding, self.dilation,
            self.groups, "bias" in self._bayesian, self.padding_mode,
            device=self.weight_init.device, dtype=self.weight_init.dtype,
        )  # fmt: skip
        for name, param in twin.named_parameters():
            self.set_initial_value(name, param)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = self._spatial_dims
        if input.dim() < d + 1 or input.shape[-(d + 1)] != self.in_channels:
            raise ValueError(
                f"{type(self).__name__}(in_channels={self.in_channels}) expects input of shape "
                f"(*batch, {self.in_channels}, {', '.join('L' + str(i) for i in range(d))}), "
                f"got {tuple(input.shape)}."
            )
        padding = self.padding
        if self.padding_mode != "zeros":
            features = input.shape[-(d + 1) :]
            flat = F.pad(input.reshape((-1, *features)), self._reversed_padding_repeated_twice, mode=self.padding_mode)
            input = flat.reshape(input.shape[: -(d + 1)] + flat.shape[1:])
            padding = (0,) * d
        apply = partial(batched_conv, spatial_dims=d, stride=self.stride, padding=padding, dilation=self.dilation,
                        groups=self.groups)  # fmt: skip
        return self._affine(input, apply, feature_dims=d + 1)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._spatial_dims:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._spatial_dims:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if "bias" not in self._bayesian:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return f"{s}, {self._prior_repr()}"


class BayesianConv1d(_BayesianConvNd):
    """Bayesian twin of :class:`torch.nn.Conv1d`; see :class:`BayesianConv2d`.

    Example
    -------
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

    Example
    -------
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

    Example
    -------
    >>> BayesianConv3d(1, 2, 3)(torch.randn(1, 1, 5, 5, 5)).shape
    torch.Size([1, 2, 3, 3, 3])
    """

    _twin_class = nn.Conv3d
    _spatial_dims = 3

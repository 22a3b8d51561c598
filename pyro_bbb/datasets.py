"""Generated data sets for tutorials, tests and benchmarks (nothing is downloaded).

Example
-------
>>> x, y = toy_regression(100, seed=0)
>>> x.shape, y.shape
(torch.Size([100, 1]), torch.Size([100]))
"""

from __future__ import annotations

import torch

__all__ = ["toy_regression"]


def toy_regression(n: int, seed: int = 0, noise: float = 0.1, gap: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = sin(3x) + noise`` with ``x`` in ``[-2, -0.5] U [0.5, 2]`` (or ``[-2, 2]`` when ``gap=False``).

    The gap in the middle and the region beyond ``|x| = 2`` have no data: a good posterior is wide there.

    Parameters
    ----------
    n : int
        Number of points.
    seed : int
        Seed of the generator (the global RNG is not touched).
    noise : float
        Standard deviation of the Gaussian noise.
    gap : bool
        Leave out ``(-0.5, 0.5)``.

    Returns
    -------
    x : Tensor of shape ``(n, 1)``
    y : Tensor of shape ``(n,)``

    Example
    -------
    >>> x, _ = toy_regression(10, gap=True)
    >>> bool(((x.abs() >= 0.5) & (x.abs() <= 2)).all())
    True
    """
    if n < 1:
        raise ValueError(f"`n` must be >= 1, got {n}.")
    g = torch.Generator().manual_seed(seed)
    if gap:
        u = torch.rand(n, generator=g) * 1.5 + 0.5
        x = torch.where(torch.arange(n) % 2 == 0, -u, u)
    else:
        x = torch.rand(n, generator=g) * 4 - 2
    y = torch.sin(3 * x) + noise * torch.randn(n, generator=g)
    return x.unsqueeze(-1), y

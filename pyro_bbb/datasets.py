"""Generated data sets for tutorials, tests and benchmarks (nothing is downloaded).

Example
-------
>>> x, y = toy_regression(100, seed=0)
>>> x.shape, y.shape
(torch.Size([100, 1]), torch.Size([100]))
"""

from __future__ import annotations

import torch

__all__ = ["toy_regression", "heteroscedastic_regression", "heteroscedastic_noise_std", "digits"]


def _generator(n: int, seed: int) -> torch.Generator:
    if n < 1:
        raise ValueError(f"`n` must be >= 1, got {n}.")
    return torch.Generator().manual_seed(seed)


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
    g = _generator(n, seed)
    if gap:
        u = torch.rand(n, generator=g) * 1.5 + 0.5
        x = torch.where(torch.arange(n) % 2 == 0, -u, u)
    else:
        x = torch.rand(n, generator=g) * 4 - 2
    y = torch.sin(3 * x) + noise * torch.randn(n, generator=g)
    return x.unsqueeze(-1), y


def heteroscedastic_noise_std(x: torch.Tensor) -> torch.Tensor:
    """The noise standard deviation of :func:`heteroscedastic_regression` at ``x``: ``0.1 + 0.2 |x|``."""
    return 0.1 + 0.2 * x.abs()


def heteroscedastic_regression(
    n: int, seed: int = 0, low: float = -2.0, high: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = sin(2x) + (0.1 + 0.2 |x|) * eps`` with ``x ~ Uniform(low, high)``: noise that grows with ``|x|``.

    Returns
    -------
    x : Tensor of shape ``(n, 1)``
    y : Tensor of shape ``(n,)``

    Example
    -------
    >>> x, y = heteroscedastic_regression(5000, seed=0)
    >>> resid = y - torch.sin(2 * x.squeeze(-1))
    >>> round(float(resid[x.squeeze(-1).abs() < 0.2].std()), 1), round(float(resid[x.squeeze(-1).abs() > 1.8].std()), 1)
    (0.1, 0.5)
    """
    if not high > low:
        raise ValueError(f"`high` must exceed `low`, got low={low}, high={high}.")
    g = _generator(n, seed)
    x = torch.rand(n, generator=g) * (high - low) + low
    y = torch.sin(2 * x) + heteroscedastic_noise_std(x) * torch.randn(n, generator=g)
    return x.unsqueeze(-1), y


def digits(test_fraction: float = 0.25, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes), split and scaled to ``[0, 1]``.

    Needs scikit-learn (``pip install scikit-learn``); nothing is downloaded.

    Returns
    -------
    x_train, y_train, x_test, y_test
        Inputs of shape ``(n, 64)`` (float32) and integer labels.

    Example
    -------
    >>> x_train, y_train, x_test, y_test = digits()
    >>> x_train.shape, x_test.shape, int(y_train.max())
    (torch.Size([1348, 64]), torch.Size([449, 64]), 9)
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("datasets.digits needs scikit-learn: pip install scikit-learn") from error
    if not 0 < test_fraction < 1:
        raise ValueError(f"`test_fraction` must lie in (0, 1), got {test_fraction!r}.")
    data = load_digits()
    x = torch.as_tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.as_tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    num_test = int(round(test_fraction * len(y)))
    test, train = perm[:num_test], perm[num_test:]
    return x[train], y[train], x[test], y[test]

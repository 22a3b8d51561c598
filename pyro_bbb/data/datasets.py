"""Generated data sets for tutorials, tests and benchmarks (nothing is downloaded).

Examples
--------
>>> x, y = toy_regression(100, seed=0)
>>> x.shape, y.shape
(torch.Size([100, 1]), torch.Size([100]))
"""

from __future__ import annotations

import random

import torch

__all__ = [
    "toy_regression",
    "heteroscedastic_regression",
    "heteroscedastic_noise_std",
    "digits",
    "embedded_reber",
    "is_reber",
    "is_embedded_reber",
    "REBER_SYMBOLS",
]


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

    Examples
    --------
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
    """The noise standard deviation of :func:`heteroscedastic_regression` at ``x``: ``0.1 + 0.2 |x|``.

    Examples
    --------
    >>> heteroscedastic_noise_std(torch.tensor([0.0, -2.0]))
    tensor([0.1000, 0.5000])
    """
    return 0.1 + 0.2 * x.abs()


def heteroscedastic_regression(
    n: int, seed: int = 0, low: float = -2.0, high: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = sin(2x) + (0.1 + 0.2 |x|) * eps`` with ``x ~ Uniform(low, high)``: noise that grows with ``|x|``.

    Returns
    -------
    x : Tensor of shape ``(n, 1)``
    y : Tensor of shape ``(n,)``

    Examples
    --------
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

    Examples
    --------
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


#: The seven symbols of the (embedded) Reber grammar, in one-hot order.
REBER_SYMBOLS = "BTPSXVE"

# The Reber grammar as an automaton: state -> {symbol: next state}; a string is B, a walk from state 1 to the end
# state 6, then E (Reber 1967; Hochreiter & Schmidhuber 1997, fig. 5).
_REBER = {1: {"T": 2, "P": 3}, 2: {"S": 2, "X": 4}, 3: {"T": 3, "V": 5}, 4: {"X": 3, "S": 6}, 5: {"P": 4, "V": 6}}


def is_reber(string: str) -> bool:
    """Whether ``string`` is a Reber string: ``B``, a path through the automaton below, ``E``.

    ``1 -T-> 2, 1 -P-> 3, 2 -S-> 2, 2 -X-> 4, 3 -T-> 3, 3 -V-> 5, 4 -X-> 3, 4 -S-> end, 5 -P-> 4, 5 -V-> end``.

    Examples
    --------
    >>> is_reber("BTXSE"), is_reber("BPVVE"), is_reber("BTXXE")
    (True, True, False)
    """
    if len(string) < 2 or string[0] != "B" or string[-1] != "E":
        return False
    state = 1
    for symbol in string[1:-1]:
        state = _REBER.get(state, {}).get(symbol)
        if state is None:
            return False
    return state == 6


def is_embedded_reber(string: str) -> bool:
    """Whether ``string`` is an embedded Reber string: ``B``, ``T`` or ``P``, a Reber string, the same letter, ``E``.

    Remembering the second symbol until the second-to-last is the long-range dependency that makes the grammar a
    classic test of recurrent nets.

    Examples
    --------
    >>> is_embedded_reber("BTBTXSETE"), is_embedded_reber("BTBTXSEPE")
    (True, False)
    """
    return (
        len(string) >= 9 and string[0] == "B" and string[1] in "TP" and string[-2] == string[1]
        and string[-1] == "E" and is_reber(string[2:-2])
    )


def _random_reber(rng: random.Random) -> str:
    symbols, state = ["B"], 1
    while state != 6:
        symbol, state = rng.choice(sorted(_REBER[state].items()))
        symbols.append(symbol)
    return "".join(symbols) + "E"


def _random_embedded_reber(rng: random.Random, max_len: int) -> str:
    while True:
        wrap = rng.choice("TP")
        string = f"B{wrap}{_random_reber(rng)}{wrap}E"
        if len(string) <= max_len:
            return string


def embedded_reber(n: int, max_len: int = 12, seed: int = 0, return_strings: bool = False, padding: str = "end"):
    """A balanced binary task on the Embedded Reber Grammar: is the string grammatical?

    Half of the strings are random embedded Reber strings of at most ``max_len`` symbols; the other half are such
    strings with one symbol replaced by a different one, re-drawn until the result is *not* grammatical (so the
    labels are exact). Many corruptions break the long-range rule (second symbol = second-to-last).

    Parameters
    ----------
    n : int
        Number of strings.
    max_len : int
        Length of the encoding (at least 9); shorter strings are padded with all-zero rows.
    seed : int
        Seed of the generator (the global RNGs are not touched).
    return_strings : bool
        Also return the strings.
    padding : {"end", "start"}
        Where the padding rows go: after the string (a model reading the last step must carry its state through
        them) or before it (the last step is the string's last symbol).

    Returns
    -------
    x : Tensor ``(n, max_len, 7)``, float32 one-hot over :data:`REBER_SYMBOLS`
    y : Tensor ``(n,)``, long, 1 for grammatical strings
    strings : list of str (only with ``return_strings=True``)

    Examples
    --------
    >>> x, y, strings = embedded_reber(6, seed=0, return_strings=True)
    >>> x.shape, int(y.sum())
    (torch.Size([6, 12, 7]), 3)
    >>> all(is_embedded_reber(s) == bool(label) for s, label in zip(strings, y))
    True
    >>> front, _ = embedded_reber(6, seed=0, padding="start")
    >>> bool((front[:, -1].sum(-1) == 1).all())                   # every string ends at the last step
    True
    """
    if padding not in ("end", "start"):
        raise ValueError(f"`padding` must be 'end' or 'start', got {padding!r}.")
    if n < 1:
        raise ValueError(f"`n` must be >= 1, got {n}.")
    if max_len < 9:
        raise ValueError(f"`max_len` must be at least 9 (the shortest embedded Reber string), got {max_len}.")
    rng = random.Random(seed)
    strings, labels = [], []
    for i in range(n):
        string = _random_embedded_reber(rng, max_len)
        valid = i % 2 == 0
        while not valid:
            position = rng.randrange(len(string))
            symbol = rng.choice([c for c in REBER_SYMBOLS if c != string[position]])
            corrupted = string[:position] + symbol + string[position + 1 :]
            if not is_embedded_reber(corrupted):
                string, valid = corrupted, True
        strings.append(string)
        labels.append(int(i % 2 == 0))
    order = list(range(n))
    rng.shuffle(order)
    strings, labels = [strings[i] for i in order], [labels[i] for i in order]
    x = torch.zeros(n, max_len, len(REBER_SYMBOLS))
    for i, string in enumerate(strings):
        offset = max_len - len(string) if padding == "start" else 0
        for t, symbol in enumerate(string):
            x[i, offset + t, REBER_SYMBOLS.index(symbol)] = 1.0
    y = torch.tensor(labels, dtype=torch.long)
    return (x, y, strings) if return_strings else (x, y)

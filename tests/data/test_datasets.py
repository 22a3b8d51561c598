import pytest
import torch

from pyro_bbb.data import datasets


@pytest.mark.parametrize(
    "string, valid",
    [
        ("BTBTXSETE", True),  # the shortest strings
        ("BPBPVVEPE", True),
        ("BTBTSSXSETE", True),
        ("BPBTXXVVEPE", True),  # 1 -T-> 2 -X-> 4 -X-> 3 -V-> 5 -V-> end
        ("BTBPVVEPE", False),  # second symbol T, second-to-last P: the long-range rule
        ("BTBTXXETE", False),  # inner string ends in state 3
        ("BTBTXSET", False),  # no final E
        ("TTBTXSETE", False),
        ("BTTXSETE", False),  # inner string lacks its B
    ],
)
def test_grammar_against_known_strings(string, valid):
    assert datasets.is_embedded_reber(string) is valid


def test_embedded_reber_is_balanced_exact_and_encoded():
    x, y, strings = datasets.embedded_reber(400, seed=3, return_strings=True)
    assert x.shape == (400, 12, 7) and y.dtype == torch.long and int(y.sum()) == 200
    assert all(datasets.is_embedded_reber(s) == bool(label) for s, label in zip(strings, y))
    assert all(9 <= len(s) <= 12 for s in strings)
    for row, string in zip(x, strings):
        decoded = "".join(datasets.REBER_SYMBOLS[i] for i in row[: len(string)].argmax(-1))
        assert decoded == string and row[len(string) :].abs().sum() == 0
    # the same seed gives the same data
    again = datasets.embedded_reber(400, seed=3)
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    with pytest.raises(ValueError, match="max_len"):
        datasets.embedded_reber(4, max_len=8)


def test_embedded_reber_padding_at_the_start_shifts_each_string_to_end_at_the_last_step():
    end, y_end, strings = datasets.embedded_reber(40, max_len=14, seed=3, return_strings=True)
    start, y_start = datasets.embedded_reber(40, max_len=14, seed=3, padding="start")
    assert torch.equal(y_end, y_start)
    for i, string in enumerate(strings):
        assert torch.equal(start[i, 14 - len(string):], end[i, : len(string)])
        assert start[i, : 14 - len(string)].abs().sum() == 0
    with pytest.raises(ValueError, match="'end' or 'start'"):
        datasets.embedded_reber(4, padding="front")

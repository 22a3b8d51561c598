import pytest

from pyro_bbb.infer.schedules import Constant, Cyclical, LinearWarmup


def test_constant():
    assert [Constant(0.3)(s) for s in (0, 5, 10_000)] == [0.3, 0.3, 0.3]


def test_linear_warmup_ramps_then_holds():
    w = LinearWarmup(10, start=0.2, end=1.0)
    assert w(0) == pytest.approx(0.2)
    assert w(5) == pytest.approx(0.6)
    assert w(10) == w(500) == pytest.approx(1.0)


def test_cyclical_follows_fu_et_al():
    c = Cyclical(period=10, ratio=0.5)
    assert [c(s) for s in range(12)] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1, 1, 1, 1, 1, 0, 0.2])


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: Constant(-1.0), "weight"),
        (lambda: Constant(float("nan")), "weight"),
        (lambda: LinearWarmup(0), "warmup_steps"),
        (lambda: LinearWarmup(5, start=-0.1), "start"),
        (lambda: Cyclical(0), "period"),
        (lambda: Cyclical(1), "period"),  # (weight 0 at every step)
        (lambda: Cyclical(10, ratio=0.0), "ratio"),
        (lambda: Cyclical(10, ratio=1.5), "ratio"),
    ],
)
def test_invalid_arguments_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=f"`{arg}`"):
        make()


def test_repr():
    assert repr(LinearWarmup(5)) == "LinearWarmup(warmup_steps=5, start=0.0, end=1.0)"

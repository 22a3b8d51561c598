"""pyro_bbb.nn.moments: the moment rules against numerical integration and Monte Carlo, the carrier's operations."""

import math

import pytest
import torch
import torch.nn.functional as F

from pyro_bbb import likelihoods
from pyro_bbb.distributions import ExpectedNormal
from pyro_bbb.nn.moments import (
    MomentPropagationError,
    Moments,
    affine_moments,
    elementwise_moments,
    gaussian_expectation,
    leaky_relu_moments,
    relu_moments,
    standardized_expectations,
    tracking_modules,
)

MEANS = torch.tensor([-2.0, -0.3, 0.0, 0.7, 3.0], dtype=torch.float64)
STDS = [0.1, 0.5, 1.0, 2.0]


def integrated(fn, mean: float, std: float) -> tuple[float, float]:
    """Mean and variance of fn(X), X ~ N(mean, std^2), by the trapezoid rule on a fine grid (float64)."""
    x = torch.linspace(mean - 12 * std, mean + 12 * std, 200_001, dtype=torch.float64)
    density = torch.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    f = fn(x)
    m = torch.trapezoid(f * density, x)
    return float(m), float(torch.trapezoid((f - m) ** 2 * density, x))


def check_against_integration(moments_fn, fn, mean_tol, var_rtol):
    for std in STDS:
        mean, var = moments_fn(MEANS, torch.full_like(MEANS, std**2))
        for i, m in enumerate(MEANS.tolist()):
            exact_mean, exact_var = integrated(fn, m, std)
            assert abs(float(mean[i]) - exact_mean) < mean_tol, (m, std)
            assert abs(float(var[i]) - exact_var) <= var_rtol * exact_var + 1e-12, (m, std)


def test_relu_moments_equal_the_integrals():
    check_against_integration(relu_moments, torch.relu, 1e-7, 1e-6)


def test_relu_moments_of_a_point_mass_are_relu_and_zero_with_finite_gradients():
    mean = torch.tensor([-1.0, 2.0], requires_grad=True)
    variance = torch.zeros(2, requires_grad=True)
    m, v = relu_moments(mean, variance)
    assert m.tolist() == [0.0, 2.0] and v.tolist() == [0.0, 0.0]
    (m.sum() + v.sum()).backward()
    assert torch.isfinite(mean.grad).all() and torch.isfinite(variance.grad).all()


@pytest.mark.parametrize("slope", [0.01, 0.2, -0.5])
def test_leaky_relu_moments_equal_the_integrals(slope):
    check_against_integration(lambda m, v: leaky_relu_moments(m, v, slope),
                              lambda x: F.leaky_relu(x, slope), 1e-7, 1e-6)


@pytest.mark.parametrize("fn", [torch.tanh, torch.sigmoid, F.softplus, F.gelu, F.silu], ids=lambda f: f.__name__)
def test_smooth_activation_moments_equal_the_integrals(fn):
    """Gauss-Hermite with 64 nodes: within 1e-4 (mean) and 0.1% (variance) up to a pre-activation std of 2."""
    check_against_integration(lambda m, v: elementwise_moments(fn, m, v), fn, 1e-4, 1e-3)


def test_relu_moments_equal_monte_carlo():
    torch.manual_seed(0)
    mean, var = torch.tensor([0.4]), torch.tensor([2.0])
    draws = torch.relu(mean + var.sqrt() * torch.randn(1_000_000))
    m, v = relu_moments(mean, var)
    se = draws.std() / 1000
    assert abs(float(m) - float(draws.mean())) < 4 * se
    assert abs(float(v) - float(draws.var())) < 0.01 * float(v)


def test_gaussian_expectation_of_a_polynomial_is_exact():
    mean, var = torch.tensor([0.5], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    # E[X^4] = m^4 + 6 m^2 v + 3 v^2
    expected = 0.5**4 + 6 * 0.25 * 2.0 + 3 * 4.0
    fourth = gaussian_expectation(lambda x: x**4, mean, var)
    assert torch.allclose(fourth, torch.tensor([expected], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_affine_moments_equal_monte_carlo(kind):
    """Random Gaussian inputs and weights: the output's mean and variance by 400k joint draws (4 standard errors for
    the mean, 2% for the variance)."""
    torch.manual_seed(1)
    if kind == "linear":
        in_shape, w_shape, b_shape = (2, 4), (3, 4), (3,)

        def apply(x, w, b):
            return F.linear(x, w, b)
    else:
        in_shape, w_shape, b_shape = (1, 2, 5), (3, 2, 3), (3,)

        def apply(x, w, b):
            return F.conv1d(x, w, b, padding=1)
    x_mean, x_var = torch.randn(in_shape), torch.rand(in_shape) + 0.1
    loc, scale = torch.randn(w_shape), torch.rand(w_shape) * 0.5 + 0.1
    b_loc, b_scale = torch.randn(b_shape), torch.rand(b_shape) * 0.5 + 0.1
    out = affine_moments(Moments(x_mean, x_var), apply, (loc, scale), (b_loc, b_scale))
    draws = []
    for _ in range(40):
        n = 10_000
        x = x_mean + x_var.sqrt() * torch.randn(n, *in_shape)
        w = loc + scale * torch.randn(n, *w_shape)
        b = b_loc + b_scale * torch.randn(n, *b_shape)
        draws.append(torch.stack([apply(x[i], w[i], b[i]) for i in range(n)]) if kind == "conv1d"
                     else torch.einsum("nbi,noi->nbo", x, w) + b[:, None])
    draws = torch.cat(draws)
    se = draws.std(0) / math.sqrt(len(draws))
    assert ((out.mean - draws.mean(0)).abs() < 4 * se).all()
    assert torch.allclose(out.variance, draws.var(0), rtol=0.02)


def test_affine_moments_of_a_plain_input_have_no_input_variance():
    x = torch.tensor([[1.0, -2.0]])
    out = affine_moments(x, F.linear, (torch.ones(1, 2), torch.full((1, 2), 0.5)), (torch.zeros(1), torch.ones(1)))
    assert torch.allclose(out.variance, torch.tensor([[0.25 * 5 + 1.0]]))


# -- the carrier ------------------------------------------------------------------------------------------------
def test_moments_follow_shape_operations_and_constants():
    m = Moments(torch.arange(6.0).view(2, 3), torch.arange(6.0).view(2, 3) + 1)
    last = m[:, -1]
    assert torch.equal(last.mean, torch.tensor([2.0, 5.0])) and torch.equal(last.variance, torch.tensor([3.0, 6.0]))
    assert m.view(3, 2).shape == (3, 2) and m.reshape(-1).shape == (6,) and m.flatten().shape == (6,)
    assert torch.flatten(m).shape == (6,) and m.unsqueeze(0).shape == (1, 2, 3) and m.transpose(0, 1).shape == (3, 2)
    joined = torch.cat([m, torch.ones(2, 1)], dim=-1)
    assert torch.equal(joined.variance[:, -1], torch.zeros(2)) and joined.shape == (2, 4)
    scaled = 3 - 2 * m / 4
    assert torch.allclose(scaled.mean, 3 - m.mean / 2) and torch.allclose(scaled.variance, m.variance / 4)
    product = m @ torch.ones(3, 1)
    assert torch.allclose(product.variance, m.variance.sum(-1, keepdim=True))
    layer = torch.nn.Linear(3, 2)
    out = layer(m)
    assert torch.allclose(out.variance, m.variance @ layer.weight.T.pow(2))
    assert torch.nn.Dropout(0.3).eval()(m) is m


@pytest.mark.parametrize("expression", [
    lambda m: torch.softmax(m, -1), lambda m: m.exp(), lambda m: m + m, lambda m: 1 / m,
    lambda m: torch.nn.Dropout(0.3).train()(m), lambda m: torch.nn.LayerNorm(3)(m),
    lambda m: torch.distributions.Normal(m, 1.0),
], ids=["softmax", "exp", "m+m", "1/m", "dropout", "layernorm", "distribution"])
def test_an_operation_without_a_rule_is_a_clear_error(expression):
    m = Moments(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises((MomentPropagationError, AttributeError), match="moment propagation|pyro_bbb likelihood"):
        expression(m)


def test_the_error_names_the_module():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Softmax(dim=-1))
    with tracking_modules(), pytest.raises(MomentPropagationError, match="softmax in module Softmax"):
        net(Moments(torch.zeros(2, 3), torch.ones(2, 3)))
    with pytest.raises(MomentPropagationError, match=r"softmax: "):  # outside the block: no module named
        net(Moments(torch.zeros(2, 3), torch.ones(2, 3)))


# -- the expected log-likelihood ----------------------------------------------------------------------------------
def test_expected_normal_equals_the_monte_carlo_expectation():
    torch.manual_seed(2)
    loc, loc_var, y = torch.tensor([0.3, -1.0]), torch.tensor([0.5, 2.0]), torch.tensor([1.0, 0.0])
    scale = torch.tensor(0.7)
    fn = ExpectedNormal(loc, loc_var, scale.log(), scale.pow(-2))
    f = loc + loc_var.sqrt() * torch.randn(1_000_000, 2)
    log_probs = torch.distributions.Normal(f, scale).log_prob(y)
    se = log_probs.std(0) / 1000
    assert ((fn.log_prob(y) - log_probs.mean(0)).abs() < 4 * se).all()


def test_heteroscedastic_expected_log_likelihood_equals_monte_carlo():
    """Mean and raw scale independent Gaussians; 1M joint draws, 4 standard errors."""
    torch.manual_seed(3)
    likelihood = likelihoods.HeteroscedasticGaussian(min_scale=0.01)
    mean = torch.tensor([[0.2, -1.0], [1.5, 0.5]])
    variance = torch.tensor([[0.3, 0.8], [0.1, 2.0]])
    y = torch.tensor([0.0, 2.0])
    expected = likelihood.moment_distribution(Moments(mean, variance)).log_prob(y)
    f = mean + variance.sqrt() * torch.randn(1_000_000, 2, 2)
    log_probs = likelihood.distribution(f).log_prob(y)
    se = log_probs.std(0) / 1000
    assert ((expected - log_probs.mean(0)).abs() < 4 * se).all()


def test_heteroscedastic_expected_log_likelihood_with_a_correlated_scale_equals_monte_carlo():
    """Mean and raw scale out of one linear map of Gaussian units (fixed weights, rows alike): jointly Gaussian and
    correlated, the case the covariance terms make exact. 1M draws, 4 standard errors; treated as independent the
    same outputs miss by more than 20 (the test has power)."""
    torch.manual_seed(4)
    likelihood = likelihoods.HeteroscedasticGaussian(min_scale=0.01)
    hidden = Moments(torch.tensor([[0.5, -0.2, 1.0], [1.0, 0.3, -0.5]]),
                     torch.tensor([[0.4, 0.9, 0.2], [0.3, 0.5, 1.0]]))
    loc, bias = torch.tensor([[1.0, 0.5, -1.0], [0.8, 0.7, -0.6]]), torch.tensor([0.0, 0.5])
    output = affine_moments(hidden, F.linear, (loc, torch.zeros(2, 3)), (bias, torch.zeros(2)), linear=True)
    y = torch.tensor([0.0, 2.0])
    expected = likelihood.moment_distribution(output).log_prob(y)
    independent = likelihood.moment_distribution(Moments(output.mean, output.variance)).log_prob(y)
    units = hidden.mean + hidden.variance.sqrt() * torch.randn(1_000_000, 2, 3)
    log_probs = likelihood.distribution(F.linear(units, loc, bias)).log_prob(y)
    reference, se = log_probs.mean(0), log_probs.std(0) / 1000
    assert ((expected - reference) / se).abs().max() < 4
    assert ((independent - reference) / se).abs().max() > 20


def test_standardized_expectations_against_integration():
    for mean, std in [(0.3, 0.5), (-1.0, 2.0)]:
        e0, e1, e2 = standardized_expectations(torch.sigmoid, torch.tensor([mean], dtype=torch.float64),
                                               torch.tensor([std**2], dtype=torch.float64))
        for power, value in enumerate((e0, e1, e2)):
            exact, _ = integrated(lambda x, p=power, m=mean, s=std: torch.sigmoid(x) * ((x - m) / s) ** p, mean, std)
            assert abs(float(value) - exact) < 1e-8
    e0, e1, e2 = standardized_expectations(torch.exp, torch.tensor([1.0]), torch.tensor([0.0]))  # no variance
    assert torch.allclose(e0, torch.tensor([math.e])) and abs(float(e1)) < 1e-6 and torch.allclose(e2, e0)


def test_expected_normal_expands_and_draws_nothing():
    fn = ExpectedNormal(torch.zeros(1), torch.ones(1), torch.zeros(1), torch.ones(1)).expand((3,))
    assert fn.batch_shape == (3,) and fn.log_prob(torch.zeros(3)).shape == (3,)
    with pytest.raises(NotImplementedError, match="draws nothing"):
        fn.sample()

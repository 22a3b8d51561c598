import pyro
import pytest
import torch

import pyro_bbb


def test_joint_adam_makes_the_same_updates_as_pyros_per_parameter_adam():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(shape)) for shape in [(3, 2), (4,), (2,)]]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    joint, per_parameter = pyro_bbb.optim.Adam(lr=0.05), pyro.optim.Adam({"lr": 0.05})
    for step in range(6):
        active = [0, 1] if step < 2 else [0, 1, 2] if step % 2 else [0, 2]  # the third joins late, one skips steps
        grads = [torch.randn_like(p) for p in ours]
        for group in (ours, theirs):
            for i, p in enumerate(group):
                p.grad = grads[i].clone() if i in active else None
        joint([ours[i] for i in active])
        per_parameter([theirs[i] for i in active])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_trains_with_svi_and_is_the_default_of_fit():
    model = pyro_bbb.BNN(pyro_bbb.nn.BayesianLinear(2, 1), pyro_bbb.likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    svi = pyro.infer.SVI(model, guide, pyro_bbb.optim.Adam(lr=0.05), pyro_bbb.ELBO(num_data=40))
    x = torch.randn(40, 2)
    y = x @ torch.tensor([1.0, -2.0])
    losses = [svi.step(x, y) for _ in range(200)]
    assert losses[-1] < 0.01 * losses[0]
    assert repr(pyro_bbb.optim.Adam(lr=0.01)).startswith("Adam(lr=0.01")


def test_state_round_trip():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    optimizer = pyro_bbb.optim.Adam()
    with pytest.raises(ValueError, match="already stepped"):
        optimizer.set_state({"joint_adam": None})
    optimizer([p])
    state = optimizer.get_state()
    optimizer.set_state(state)
    assert optimizer.optimizer.state[p]["step"] == 1


def test_set_learning_rate_applies_to_the_parameters_there_and_those_that_join_later():
    first, second = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = pyro_bbb.optim.Adam(lr=0.1)
    first.grad = torch.ones(2)
    optimizer([first])
    optimizer.set_learning_rate(0.01)
    first.grad, second.grad = torch.ones(2), torch.ones(2)
    optimizer([first, second])  # Adam with a constant gradient moves every coordinate by the learning rate
    torch.testing.assert_close(first.detach(), torch.full((2,), -0.11))
    torch.testing.assert_close(second.detach(), torch.full((2,), -0.01))

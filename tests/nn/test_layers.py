import itertools

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import Predictive
from torch import nn

import pyro_bbb
from pyro_bbb import ELBO, MeanFieldGuide, likelihoods, priors
from pyro_bbb._internals import vectorized_model
from pyro_bbb.nn import BayesianLinear, batched_conv, batched_linear
from pyro_bbb.nn import conv as bayesian_conv

from ..helpers import MLP, Regression

CONV = {1: (bayesian_conv.BayesianConv1d, nn.Conv1d, F.conv1d), 2: (bayesian_conv.BayesianConv2d, nn.Conv2d, F.conv2d),
        3: (bayesian_conv.BayesianConv3d, nn.Conv3d, F.conv3d)}


def test_linear_is_twin_of_torch():
    torch.manual_seed(3)
    twin = nn.Linear(5, 4)
    torch.manual_seed(3)
    layer = BayesianLinear(5, 4)
    assert torch.equal(layer.weight_init, twin.weight) and torch.equal(layer.bias_init, twin.bias)
    x = torch.randn(7, 2, 5)
    tr = poutine.trace(layer).get_trace(x)
    w, b = tr.nodes["weight"]["value"], tr.nodes["bias"]["value"]
    assert w.shape == (4, 5) and b.shape == (4,)
    assert torch.allclose(tr.nodes["_RETURN"]["value"], F.linear(x, w, b))
    assert "bias" not in poutine.trace(BayesianLinear(5, 4, bias=False)).get_trace(x).nodes


def test_repr_shows_prior():
    assert repr(BayesianLinear(3, 2, bias=False, prior=priors.Laplace(scale=0.1))) == (
        "BayesianLinear(in_features=3, out_features=2, bias=False, prior=Laplace(loc=0.0, scale=0.1))"
    )
    assert repr(bayesian_conv.BayesianConv1d(2, 3, 3, prior=priors.ScaleMixtureNormal())).endswith(
        "prior=ScaleMixtureNormal(pi=0.5, sigma1=1.0, sigma2=0.0024787521766663585))"
    )


def test_site_names_follow_module_paths():
    tr = poutine.trace(MLP()).get_trace(torch.randn(4, 2), torch.randn(4))
    latent = set(tr.stochastic_nodes) - {"data"}  # "data" is the plate's subsample site
    assert latent == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(stride=2, padding=1, dilation=1, groups=2), dict(padding="same", dilation=2, bias=False),
     dict(padding=1, padding_mode="reflect")],
    ids=["plain", "strided-grouped", "same-dilated", "reflect"],
)
def test_conv_is_twin_of_torch(d, kwargs):
    bayes_cls, torch_cls, _ = CONV[d]
    torch.manual_seed(1)
    twin = torch_cls(4, 6, 3, **kwargs)
    torch.manual_seed(1)
    layer = bayes_cls(4, 6, 3, **kwargs)
    assert torch.equal(layer.weight_init, twin.weight)
    x = torch.randn(2, 4, *([7] * d))
    with torch.no_grad():
        twin.weight.copy_(layer.weight_init)
        cond = {"weight": layer.weight_init}
        if twin.bias is not None:
            cond["bias"] = layer.bias_init
        expected = twin(x)
    got = poutine.condition(layer, data=cond)(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("weight_batch", [(5,), (5, 1), (3, 1, 1)])
def test_batched_linear_equals_loop(weight_batch):
    x = torch.randn(8, 4)
    w = torch.randn(*weight_batch, 3, 4)
    b = torch.randn(*weight_batch, 3)
    got = batched_linear(x, w, b)
    flat_w, flat_b = w.reshape(-1, 3, 4), b.reshape(-1, 3)
    expected = torch.stack([F.linear(x, flat_w[i], flat_b[i]) for i in range(flat_w.shape[0])])
    # weights are global: (5, out, in) is read as (5, 1, out, in)
    assert got.shape == torch.broadcast_shapes(weight_batch if len(weight_batch) > 1 else (5, 1), (8,)) + (3,)
    assert torch.allclose(got.reshape(expected.shape), expected, atol=1e-6)
    # A second layer sees inputs that already carry the sample dims.
    h = batched_linear(got, torch.randn(*weight_batch, 2, 3))
    assert h.shape == got.shape[:-1] + (2,)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("input_batch", [(6,), (4, 6), (4, 1, 6)])
@pytest.mark.parametrize("with_data_dim", [True, False], ids=["S,1", "S"])
def test_batched_conv_equals_loop(d, input_batch, with_data_dim):
    _, _, conv = CONV[d]
    w = torch.randn(4, 1, 6, 2, *([3] * d))  # 4 draws, groups=2, in_channels=4
    b = torch.randn(4, 1, 6)
    x = torch.randn(*input_batch, 4, *([6] * d))
    kw = dict(stride=(2,) * d, padding=(1,) * d, dilation=(1,) * d, groups=2)
    if with_data_dim:
        got = batched_conv(x, w, b, spatial_dims=d, **kw)
    else:  # (S, out, ...) is read as (S, 1, out, ...)
        got = batched_conv(x, w.squeeze(1), b.squeeze(1), spatial_dims=d, **kw)
    # reference: one plain convolution per element of the broadcast batch
    full = torch.broadcast_shapes(w.shape[:2], input_batch)
    xe = x.expand(*full, *x.shape[-(d + 1) :])
    we, be = w.expand(*full, *w.shape[2:]), b.expand(*full, 6)
    for idx in itertools.product(*map(range, full)):
        expected = conv(xe[idx].unsqueeze(0), we[idx], be[idx], **kw)[0]
        assert torch.allclose(got[idx], expected, atol=1e-5), idx
    assert got.shape[: len(full)] == full


def test_wrong_input_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"in_features=3\) expects an input whose last dimension is 3"):
        BayesianLinear(3, 2)(torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"in_channels=3\) expects input of shape"):
        bayesian_conv.BayesianConv2d(3, 2, 3)(torch.randn(4, 5, 8, 8))


def test_vectorized_prediction_equals_sequential():
    model = MLP()
    guide = MeanFieldGuide(model, init_scale=0.3)
    x = torch.randn(10, 2)
    sites = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    # Predictive hands a parallel model weights of shape (S, out, in): no singleton for the data plate
    samples = {k: v.squeeze(1) for k, v in Predictive(model, guide=guide, num_samples=6, return_sites=sites)(x).items()}
    parallel = Predictive(model, posterior_samples=samples, parallel=True, return_sites=["mean", "y"])(x)
    sequential = Predictive(model, posterior_samples=samples, parallel=False, return_sites=["mean"])(x)
    assert parallel["y"].shape == (6, 10)
    mean_parallel, mean_sequential = parallel["mean"].reshape(6, 10), sequential["mean"].reshape(6, 10)
    assert torch.allclose(mean_parallel, mean_sequential, atol=1e-5)
    assert mean_parallel.std(0).min() > 0  # the draws really differ


def test_vectorized_particles_run_in_one_call():
    model = Regression()
    guide = MeanFieldGuide(model)
    elbo = ELBO(num_data=50, num_particles=7, vectorize_particles=True, max_plate_nesting=1)
    x, y = torch.randn(10, 3), torch.randn(10)
    elbo.loss(model, guide, x, y)
    guide_trace = poutine.trace(vectorized_model(elbo, guide)).get_trace(x, y)
    assert guide_trace.nodes["fc.weight"]["value"].shape == (7, 1, 1, 3)


def test_layers_follow_device_and_dtype():
    layer = BayesianLinear(3, 2).to(torch.float64)
    out = layer(torch.randn(4, 3, dtype=torch.float64))
    assert out.dtype == torch.float64
    assert layer.prior_distribution("weight").base_dist.loc.dtype == torch.float64


def test_a_model_converted_without_its_guide_names_the_guide():
    """After bnn.to(torch.float64) the guide still draws float32 weights: the error asked to cast the input or the
    model -- both done already (fit and predict cast inputs to the model's dtype) -- and never named the guide."""
    x, y = torch.randn(16, 3), torch.randn(16)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), pyro_bbb.likelihoods.Gaussian(scale=0.3))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=1, progress=False)
    bnn.to(torch.float64)
    for call in (lambda: pyro_bbb.predict(bnn, guide, x.double(), num_samples=2),
                 lambda: pyro_bbb.fit(bnn, guide, (x, y), epochs=1, kl_weight=1, progress=False)):
        with pytest.raises(TypeError, match=r"is torch.float64 but the weights its guide drew are torch.float32.*"
                                            r"guide.to\(torch.float64\)"):
            call()
    guide.to(torch.float64)
    assert pyro_bbb.predict(bnn, guide, x, num_samples=2).mean.dtype == torch.float64


def test_calling_a_layer_inside_the_data_plate_is_an_error():
    layer = BayesianLinear(3, 1)

    def model(x, y):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(layer(x).squeeze(-1), 1.0), obs=y)

    with pytest.raises(ValueError, match=r"inside pyro.plate\('data'\).*run the network before entering"):
        model(torch.randn(4, 3), torch.randn(4))


TRANSPOSED = {1: (bayesian_conv.BayesianConvTranspose1d, nn.ConvTranspose1d, F.conv_transpose1d),
              2: (bayesian_conv.BayesianConvTranspose2d, nn.ConvTranspose2d, F.conv_transpose2d),
              3: (bayesian_conv.BayesianConvTranspose3d, nn.ConvTranspose3d, F.conv_transpose3d)}


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(stride=2, padding=1, output_padding=1, groups=2), dict(stride=3, dilation=2, bias=False),
     dict(stride=2, output_padding=1, dilation=2, groups=2)],
    ids=["plain", "strided-grouped-outpad", "dilated-nobias", "all"],
)
def test_conv_transpose_is_twin_of_torch(d, kwargs):
    bayes_cls, torch_cls, _ = TRANSPOSED[d]
    torch.manual_seed(1)
    twin = torch_cls(4, 6, 3, **kwargs)
    torch.manual_seed(1)
    layer = bayes_cls(4, 6, 3, **kwargs)
    assert torch.equal(layer.weight_init, twin.weight) and layer.weight_init.shape == (4, 6 // twin.groups, *[3] * d)
    assert repr(layer).replace("BayesianConvTranspose", "ConvTranspose").startswith(repr(twin)[:-1])
    x = torch.randn(2, 4, *([5] * d))
    cond = {"weight": layer.weight_init}
    if twin.bias is not None:
        cond["bias"] = layer.bias_init
    with torch.no_grad():
        expected = twin(x)
        # output_size in forward, as torch computes the output padding from it
        size = [n - p + (s > 1) for n, p, s in zip(expected.shape[-d:], twin.output_padding, twin.stride)]
        expected_sized = twin(x, output_size=size)
    got = poutine.condition(layer, data=cond)(x)
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5)
    got_sized = poutine.condition(layer, data=cond)(x, output_size=size)
    assert got_sized.shape == expected_sized.shape and torch.allclose(got_sized, expected_sized, atol=1e-5)
    torch.manual_seed(5)
    layer.reset_parameters()
    torch.manual_seed(5)
    twin.reset_parameters()
    assert torch.equal(layer.weight_init, twin.weight)


def test_conv_transpose_output_size_errors_like_torch():
    up = bayesian_conv.BayesianConvTranspose2d(2, 2, 3, stride=2)
    with pytest.raises(ValueError, match=r"valid sizes .* range from 9 to 10"):
        up(torch.randn(1, 2, 4, 4), output_size=[12, 12])
    with pytest.raises(ValueError, match="output_size must have 2 or 4 elements"):
        up(torch.randn(1, 2, 4, 4), output_size=[9])
    with pytest.raises(ValueError, match="output padding must be smaller"):
        bayesian_conv.BayesianConvTranspose2d(2, 2, 3, stride=1, output_padding=1)
    with pytest.raises(ValueError, match=r"in_channels=2\) expects input of shape"):
        up(torch.randn(1, 3, 4, 4))


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("input_batch", [(6,), (4, 6), (4, 1, 6)])
def test_batched_conv_transpose_equals_loop(d, input_batch):
    _, _, conv = TRANSPOSED[d]
    w = torch.randn(4, 1, 4, 3, *([3] * d))  # 4 draws, in_channels=4, groups=2, out_channels=6
    b = torch.randn(4, 1, 6)
    x = torch.randn(*input_batch, 4, *([4] * d))
    kw = dict(stride=(2,) * d, padding=(1,) * d, dilation=(1,) * d, groups=2)
    got = batched_conv(x, w, b, spatial_dims=d, transposed=True, output_padding=(1,) * d, **kw)
    full = torch.broadcast_shapes(w.shape[:2], input_batch)
    xe = x.expand(*full, *x.shape[-(d + 1) :])
    we, be = w.expand(*full, *w.shape[2:]), b.expand(*full, 6)
    for idx in itertools.product(*map(range, full)):
        expected = conv(xe[idx].unsqueeze(0), we[idx], be[idx], output_padding=(1,) * d, **kw)[0]
        assert torch.allclose(got[idx], expected, atol=1e-5), idx
    assert got.shape == full + (6,) + (8,) * d


def test_set_initial_value_of_another_shape_is_refused():
    """copy_ broadcast a row over the whole weight, and a number over the bias, in silence."""
    layer = BayesianLinear(3, 2)
    with pytest.raises(ValueError, match=r"set_initial_value\('weight', \.\.\.\) needs a tensor of shape \(2, 3\)"):
        layer.set_initial_value("weight", torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(\)"):
        layer.set_initial_value("bias", torch.tensor(7.0))


def test_the_layers_take_their_twins_positional_arguments_and_priors_by_keyword():
    """prior sat where torch puts device (Linear, cells), padding_mode (ConvNd) or proj_size (LSTM): the twins' own
    positional calls failed ('prior must be a pyro_bbb.priors.Prior ... got str'); GRU lacked torch's proj_size slot, so
    torch's positional device was read as proj_size and its dtype as the device."""
    from pyro_bbb.nn import BayesianConv2d, BayesianGRU, BayesianLSTM, BayesianLSTMCell
    from pyro_bbb.nn.conv import BayesianConvTranspose2d

    assert BayesianLinear(3, 2, True, "cpu", torch.float64).weight_init.dtype == torch.float64
    conv = BayesianConv2d(2, 3, 3, 1, 1, 1, 1, True, "reflect")
    assert conv.padding_mode == "reflect" and conv(torch.randn(1, 2, 5, 5)).shape == (1, 3, 5, 5)
    assert BayesianConvTranspose2d(2, 2, 3, 2, 1, 1, 1, True, 1, "zeros", "cpu").output_padding == (1, 1)
    assert BayesianLSTM(3, 4, 1, True, False, 0.0, False, 2).proj_size == 2
    # torch.nn.GRU keeps a proj_size slot before device (it must be 0): its positional calls read it as ours do
    gru = BayesianGRU(3, 4, 1, True, True, 0.0, False, 0, "cpu", torch.float64)
    assert gru.batch_first and gru(torch.randn(2, 5, 3, dtype=torch.float64))[0].dtype == torch.float64
    with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM"):
        BayesianGRU(3, 4, proj_size=2)
    assert BayesianLSTMCell(3, 4, True, "cpu", torch.float64).weight_ih_init.dtype == torch.float64
    prior = priors.Normal(0.0, 0.5)
    assert BayesianLinear(3, 2, prior=prior).prior == prior
    with pytest.raises(TypeError):
        BayesianLinear(3, 2, True, prior)  # (a prior is never read as a device)


def test_an_output_size_of_the_wrong_length_is_refused_as_torch_refuses_it():
    from pyro_bbb.nn.conv import BayesianConvTranspose2d

    up = BayesianConvTranspose2d(2, 2, 3, stride=2)
    x = torch.randn(1, 2, 4, 4)
    assert up(x, output_size=[1, 2, 9, 9]).shape == up(x, output_size=[9, 9]).shape == (1, 2, 9, 9)
    with pytest.raises(ValueError, match="output_size must have 2 or 4 elements"):
        up(x, output_size=[2, 9, 9])


def test_setting_a_layers_prior_changes_its_parameters_priors():
    """``layer.prior = ...`` (as one sets an attribute of a torch layer) was stored and never read: every parameter
    kept the prior it was built with. It now changes the priors of the parameters that follow the layer's (not one
    given its own), makes or removes a learned prior's scale, and is refused, unchanged, for what is not a prior."""
    layer = BayesianLinear(3, 2)
    layer.prior = priors.Normal(0.0, 0.1)
    assert float(layer.prior_distribution("weight").base_dist.scale.max()) == pytest.approx(0.1)
    assert float(layer.prior_distribution("bias").base_dist.scale.max()) == pytest.approx(0.1)
    layer.prior = priors.LearnedNormal(init_scale=0.3)
    assert sorted(name for name, _ in layer.named_parameters()) == ["bias_prior_scale_unconstrained",
                                                                    "weight_prior_scale_unconstrained"]
    assert layer.prior_distribution("weight").base_dist.scale.requires_grad
    layer.prior = None  # the default again: no learned scale left behind
    assert list(layer.named_parameters()) == []
    assert float(layer.prior_distribution("weight").base_dist.scale.max()) == pytest.approx((2 / 3) ** 0.5)
    with pytest.raises((TypeError, ValueError)):
        layer.prior = "normal"
    assert isinstance(layer.prior, priors.FanInNormal)
    lstm = pyro_bbb.nn.BayesianLSTM(2, 3, recurrent_prior=priors.Normal(0.0, 0.5))
    lstm.prior = priors.Normal(0.0, 0.2)
    assert float(lstm.prior_distribution("weight_ih_l0").base_dist.scale.max()) == pytest.approx(0.2)
    assert float(lstm.prior_distribution("weight_hh_l0").base_dist.scale.max()) == pytest.approx(0.5)


def test_a_prior_set_during_training_is_the_objectives_from_the_next_step():
    """The ELBO's replayed step reads the layer's prior as it is; one made learned since the plan was recorded (its
    scale would escape the step's parameter capture) sends the step through the full path. Equal to the reference
    path (no replay), step for step."""
    def run(replay):
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = torch.nn.Sequential(BayesianLinear(3, 6), torch.nn.Tanh(), BayesianLinear(6, 1))
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(0.5))
        guide = MeanFieldGuide(bnn, init_scale=0.1)
        elbo = ELBO(num_data=100, replay=replay)
        svi = pyro.infer.SVI(bnn, guide, pyro_bbb.optim.Adam(lr=1e-2), elbo)
        x, y = torch.randn(20, 3), torch.randn(20, 1)
        losses = []
        for step in range(6):
            if step == 2:
                net[2].prior = priors.Normal(0.0, 0.05)
            if step == 4:
                net[0].prior = priors.LearnedNormal(init_scale=0.5)
            losses.append(svi.step(x, y))
        return losses, {name: p.detach().clone() for name, p in pyro.get_param_store().named_parameters()}

    fast, reference = run(True), run(False)
    assert fast[0] == reference[0]
    assert fast[1].keys() == reference[1].keys() and any("prior_scale" in name for name in fast[1])
    for name in fast[1]:
        assert torch.equal(fast[1][name], reference[1][name]), name
    assert fast[0][2] > fast[0][1] + 20  # the narrower prior's KL

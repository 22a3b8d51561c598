import warnings

import pyro
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianConv2d, BayesianLinear


def train_deterministic(net, x, y, steps=300, lr=0.01):
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    return net.eval()


def blobs(n=300, d=2, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes, d, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return centres[y] + torch.randn(n, d, generator=g), y


def images(n=200, seed=0):
    """8x8 images of a bright horizontal or vertical bar (2 classes) in noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, 8, 8, generator=g)
    pos = torch.randint(1, 7, (n,), generator=g)
    for i in range(n):
        if y[i]:
            x[i, 0, :, pos[i]] += 1.0
        else:
            x[i, 0, pos[i], :] += 1.0
    return x, y


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(4 * 16, 2)

    def forward(self, x):
        h = self.pool(torch.relu(self.norm(self.conv(x))))
        return self.head(h.flatten(-3))


def params_of(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_converted_model_predicts_like_the_original_then_trains(kind):
    if kind == "mlp":
        x, y = blobs()
        original = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    else:
        x, y = images()
        original = SmallCNN()
    original = train_deterministic(original, x, y)
    before = params_of(original)
    with torch.no_grad():
        deterministic_probs = original(x).softmax(-1)
    deterministic_accuracy = metrics.accuracy(deterministic_probs, y)

    net = pyro_bbb.bayesianize(original, init_from_weights=True)
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=1e-6)
    guide(x, y)
    pred = pyro_bbb.predict(bnn, guide, x, num_samples=10, vectorize=False)
    torch.testing.assert_close(pred.probs, deterministic_probs, atol=1e-3, rtol=0)

    net.train()
    pyro_bbb.fit(bnn, guide, (x, y), epochs=15, batch_size=50, lr=1e-3, progress=False, seed=0)
    net.eval()
    pred = pyro_bbb.predict(bnn, guide, x, num_samples=20, vectorize=False)
    assert metrics.accuracy(pred, y) >= deterministic_accuracy - 0.01
    after = params_of(original)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the original is untouched


def test_selection_by_type_name_pattern_and_predicate():
    model = SmallCNN()
    converted = pyro_bbb.bayesianize(model)
    assert isinstance(converted.conv, BayesianConv2d) and isinstance(converted.head, BayesianLinear)
    assert not isinstance(converted.norm, pyro_bbb.nn.BayesianModule)
    only_head = pyro_bbb.bayesianize(model, include=["head"])
    assert isinstance(only_head.head, BayesianLinear) and not isinstance(only_head.conv, BayesianConv2d)
    by_predicate = pyro_bbb.bayesianize(model, include=lambda name, m: isinstance(m, nn.Conv2d))
    assert isinstance(by_predicate.conv, BayesianConv2d) and not isinstance(by_predicate.head, BayesianLinear)
    excluded = pyro_bbb.bayesianize(model, exclude=["co*"])
    assert not isinstance(excluded.conv, BayesianConv2d) and isinstance(excluded.head, BayesianLinear)
    nested = nn.Sequential(nn.Sequential(nn.Linear(2, 3), nn.ReLU()), nn.Linear(3, 1))
    assert isinstance(pyro_bbb.bayesianize(nested, include=["0"])[0][0], BayesianLinear)  # a container's layers


def test_priors_per_layer():
    model = SmallCNN()
    by_pattern = pyro_bbb.bayesianize(model, prior={"conv": priors.Laplace(0.0, 0.1), "*": priors.Normal(0, 2)})
    assert by_pattern.conv.prior == priors.Laplace(0.0, 0.1) and by_pattern.head.prior == priors.Normal(0, 2)
    by_callable = pyro_bbb.bayesianize(model, prior=lambda name, m: priors.FanInNormal() if name == "head" else None)
    assert by_callable.head.prior == priors.FanInNormal() and by_callable.conv.prior == priors.DEFAULT_PRIOR


def test_moped_starts_at_the_trained_weights_with_relative_widths():
    original = nn.Linear(3, 2)
    converted = pyro_bbb.bayesianize(nn.Sequential(original), prior=priors.Moped(delta=0.1))
    guide = pyro_bbb.MeanFieldGuide(converted)
    guide(torch.randn(4, 3))
    q = guide.site_posteriors()["0.weight"]
    torch.testing.assert_close(q.loc, original.weight.detach())
    torch.testing.assert_close(q.scale, (0.1 * original.weight.detach().abs()).clamp_min(1e-3), rtol=1e-4, atol=0)
    prior = converted[0].prior_distribution("weight")
    torch.testing.assert_close(prior.base_dist.loc, original.weight.detach())


def test_last_layer_only_trains_the_body_and_saves_it(tmp_path):
    x, y = blobs()
    original = train_deterministic(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3)), x, y, steps=50)
    net = pyro_bbb.bayesianize(original, last_layer_only=True)
    assert isinstance(net[2], BayesianLinear) and not isinstance(net[0], pyro_bbb.nn.BayesianModule)
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    body_before = net[0].weight.detach().clone()
    pyro_bbb.fit(bnn, guide, (x, y), epochs=3, batch_size=50, lr=1e-2, progress=False)
    assert not torch.equal(net[0].weight.detach(), body_before)  # the deterministic body trained with the guide
    pyro_bbb.save(tmp_path / "m.pt", bnn, guide)
    pyro.clear_param_store()
    net2 = pyro_bbb.bayesianize(original, last_layer_only=True)
    bnn2 = pyro_bbb.BNN(net2, likelihoods.Categorical())
    pyro_bbb.load(tmp_path / "m.pt", bnn2, pyro_bbb.MeanFieldGuide(bnn2))
    torch.testing.assert_close(net2[0].weight, net[0].weight)


class AttentionModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.embed(x)
        h, _ = self.attn(h, h, h)
        return self.head(h.mean(-2))


def test_attention_is_left_alone_and_unsupported_requests_are_errors():
    converted = pyro_bbb.bayesianize(AttentionModel())
    assert isinstance(converted.embed, BayesianLinear) and isinstance(converted.head, BayesianLinear)
    assert not isinstance(converted.attn.out_proj, BayesianLinear)  # used through its weights, not called
    bnn = pyro_bbb.BNN(converted, likelihoods.Categorical())
    x, y = torch.randn(6, 5, 4), torch.randint(0, 2, (6,))
    pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=2, progress=False)
    for request in (["attn"], ["attn.out_proj"], ["nothing*"]):
        with pytest.raises(ValueError, match="Supported types: nn.Linear|matched no module"):
            pyro_bbb.bayesianize(AttentionModel(), include=request)
    with pytest.raises(ValueError, match=r"norm \(BatchNorm2d\)"):
        pyro_bbb.bayesianize(SmallCNN(), include=["norm", "head"])
    with pytest.raises(ValueError, match=r"drop \(Dropout\)"):
        pyro_bbb.bayesianize(nn.ModuleDict({"drop": nn.Dropout(0.1), "fc": nn.Linear(2, 3)}), include=["drop"])


class ConvAutoencoder(nn.Module):
    """8x8 images -> 4 channels at 4x4 -> 8x8 reconstructions (flattened for the Gaussian likelihood)."""

    def __init__(self):
        super().__init__()
        self.encode = nn.Conv2d(1, 4, 3, stride=2, padding=1)
        self.decode = nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.decode(torch.relu(self.encode(x)), output_size=x.shape[-2:]).flatten(1)


@pytest.mark.parametrize("estimator", ["reparam", "flipout", "local_reparam"])
def test_a_converted_convolutional_autoencoder_trains(estimator):
    x, _ = images(n=160)
    net = pyro_bbb.bayesianize(ConvAutoencoder())
    assert type(net.decode).__name__ == "BayesianConvTranspose2d" and net.decode.output_padding == (1, 1)
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.3))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    targets = x.flatten(1)
    baseline = float(((targets - targets.mean(0)) ** 2).mean())  # predicting the mean image
    pyro_bbb.fit(bnn, guide, (x, targets), epochs=60, batch_size=32, lr=0.02, estimator=estimator,
                 progress=False, seed=0)
    pyro.set_rng_seed(1)
    fast = pyro_bbb.predict(bnn, guide, x, num_samples=8, vectorize=True)
    pyro.set_rng_seed(1)
    loop = pyro_bbb.predict(bnn, guide, x, num_samples=8, vectorize=False)
    torch.testing.assert_close(fast.mean, loop.mean, atol=1e-4, rtol=1e-4)  # the same draws, batched over draws
    error = float(((fast.mean - targets) ** 2).mean())
    assert error < 0.75 * baseline, (error, baseline)


def test_a_pyro_tutorial_model_keeps_its_pyrosample_layers_and_converts_the_rest():
    """A model written as Pyro's tutorials write one (``PyroModule[nn.Linear]`` with ``PyroSample`` weights under an
    N(0, 3) prior) plus a plain ``nn.Linear`` head: bayesianize converts the head only; the PyroSample layer keeps its
    prior (its KL in the trained ELBO is the closed-form KL against N(0, 3)), Flipout reaches both layers, and naming
    the PyroSample layer in ``include`` (or passing it alone) is a clear error."""
    import pyro.distributions as dist
    from pyro.nn import PyroModule, PyroSample
    from torch.distributions import Normal, kl_divergence

    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc1 = PyroModule[nn.Linear](1, 10)
            self.fc1.weight = PyroSample(dist.Normal(0.0, 3.0).expand([10, 1]).to_event(2))
            self.fc1.bias = PyroSample(dist.Normal(0.0, 3.0).expand([10]).to_event(1))
            self.fc2 = nn.Linear(10, 1)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    converted = pyro_bbb.bayesianize(Net())
    assert isinstance(converted.fc2, BayesianLinear) and not isinstance(converted.fc1, BayesianLinear)
    x = torch.linspace(-2, 2, 64).unsqueeze(-1)
    y = torch.sin(2 * x).squeeze(-1) + 0.1 * torch.randn(64)
    bnn = pyro_bbb.BNN(converted, likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.05)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=3, batch_size=64, estimator="flipout", progress=False)
    assert set(history["kl_by_layer"]) == {"net.fc1", "net.fc2"}
    elbo = pyro_bbb.ELBO(num_data=64)
    elbo.loss(bnn, guide, x, y)
    q = guide.site_posteriors()["net.fc1.weight"]
    expected = kl_divergence(Normal(q.loc, q.scale), Normal(0.0, 3.0)).sum()
    assert float(elbo.last_terms["kl_by_site"]["net.fc1.weight"]) == pytest.approx(float(expected), rel=1e-5)
    with pytest.raises(ValueError, match=r"already Bayesian.*fc1 \(weight, bias\)"):
        pyro_bbb.bayesianize(Net(), include=["fc1"])
    with pytest.raises(ValueError, match="already Bayesian"):
        pyro_bbb.bayesianize(Net().fc1)


def test_a_layer_used_at_two_places_becomes_one_bayesian_layer_at_both():
    """named_modules() lists a shared layer once: the second reference stayed a deterministic copy (its weight moved
    apart from the posterior's in training)."""
    lin = nn.Linear(4, 4)
    net = nn.Sequential(lin, nn.Tanh(), lin, nn.Tanh(), nn.Linear(4, 1))
    converted = pyro_bbb.bayesianize(net)
    assert isinstance(converted[0], BayesianLinear) and converted[0] is converted[2]
    assert lin.weight is net[0].weight  # the original is untouched


def test_a_pyro_module_keeps_its_layers_order_so_the_same_network_runs():
    """PyroModule's setattr moved a replaced child to the end of its parent: Sequential then ran Tanh first."""
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    pyro.nn.module.to_pyro_module_(net)
    converted = pyro_bbb.bayesianize(net)
    assert list(converted._modules) == ["0", "1", "2"] and isinstance(converted[0], BayesianLinear)
    again = pyro_bbb.bayesianize(pyro_bbb.bayesianize(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)),
                                                      last_layer_only=True), include=["0"])
    assert list(again._modules) == ["0", "1", "2"]


def test_a_head_tied_to_an_embedding_left_deterministic_is_converted_with_a_warning_and_an_alias_is_no_tie():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10)
            self.head.weight = self.emb.weight  # tied, as in a language model
            self.bias = self.head.bias  # a parent's alias of its child's bias: no tie

        def forward(self, ids):
            return self.head(self.emb(ids))

    with pytest.warns(UserWarning, match=r"head \(tied to \['emb'\]\).*training unties them"):
        converted = pyro_bbb.bayesianize(LM(), include=["head"])
    assert isinstance(converted.head, BayesianLinear)


@pytest.mark.parametrize("case", ["own forward", "hook", "weight_norm", "tied"])
def test_what_a_bayesian_twin_would_silently_change_is_refused(case):
    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2.0

    first = Scaled(4, 6) if case == "own forward" else nn.Linear(4, 6)
    last = nn.Linear(6, 6)
    if case == "hook":
        first.register_forward_hook(lambda module, inputs, output: torch.relu(output))
    if case == "weight_norm":
        first = nn.utils.parametrizations.weight_norm(first)
    if case == "tied":
        first = nn.Linear(6, 6)
        last.weight = first.weight
    net = nn.Sequential(first, nn.Tanh(), last)
    expected = {"own forward": "has its own forward", "hook": "has hooks", "weight_norm": "a parametrization",
                "tied": r"tied to \['2'\]"}[case]
    with pytest.raises(ValueError, match=rf"bayesianize would silently change these layers: 0: .*{expected}"):
        pyro_bbb.bayesianize(net)
    if case != "tied":  # the way out the message names (a tied pair: both excluded, nothing left to convert)
        converted = pyro_bbb.bayesianize(net, exclude=["0"])
        assert not isinstance(converted[0], BayesianLinear) and isinstance(converted[2], BayesianLinear)


@pytest.mark.parametrize("case", ["own forward", "hook", "weight_norm", "excluded", "not included"])
def test_a_single_layer_passed_alone_gets_the_checks_a_layer_in_a_net_gets(case):
    """bayesianize(layer) converted at once: a subclass's own forward (outputs 10 times off), hooks dropped,
    exclude= ignored, a weight_norm layer an AttributeError."""
    class Scaled(nn.Linear):
        def forward(self, x):
            return 10 * super().forward(x)

    layer = Scaled(3, 2) if case == "own forward" else nn.Linear(3, 2)
    kwargs = {"exclude": lambda name, module: True} if case == "excluded" else {}
    kwargs = {"include": ["fc"]} if case == "not included" else kwargs
    if case == "hook":
        layer.register_forward_hook(lambda module, inputs, output: torch.relu(output))
    if case == "weight_norm":
        layer = nn.utils.parametrizations.weight_norm(layer)
    expected = {"own forward": r"\(the layer itself\): Scaled has its own forward", "hook": "has hooks",
                "weight_norm": "a parametrization", "excluded": "no layer to convert: the module passed is itself",
                "not included": "no layer to convert: the module passed is itself"}[case]
    with pytest.raises(ValueError, match=expected):
        pyro_bbb.bayesianize(layer, **kwargs)
    frozen = nn.Linear(3, 2).requires_grad_(False)
    with pytest.warns(UserWarning, match=r"the layer passed was frozen.*use the layer as it is") as caught:
        pyro_bbb.bayesianize(frozen)
    assert "exclude=" not in str(caught[0].message)  # (no exclude keeps the layer passed: it is refused)


def test_a_convolution_whose_own_conv_forward_holds_its_behaviour_is_refused():
    """A weight-standardised Conv2d overrides _conv_forward, not forward: it was converted without a word and its
    output at the posterior mean was off by up to 12.7."""
    class WeightStandardized(nn.Conv2d):
        def _conv_forward(self, input, weight, bias):
            w = (weight - weight.mean((1, 2, 3), keepdim=True)) / (weight.std((1, 2, 3), keepdim=True) + 1e-5)
            return F.conv2d(input, w, bias, self.stride, self.padding, self.dilation, self.groups)

    class Described(nn.Conv2d):  # what a subclass may define anew without changing the layer
        def extra_repr(self):
            return "described"

    with pytest.raises(ValueError, match="0: WeightStandardized has its own _conv_forward, which Conv2d's would"):
        pyro_bbb.bayesianize(nn.Sequential(WeightStandardized(3, 4, 3)))
    assert isinstance(pyro_bbb.bayesianize(nn.Sequential(Described(3, 4, 3)))[0], BayesianConv2d)


def test_a_layer_shared_by_two_parts_is_selected_under_either_name():
    """encoder and decoder holding one Linear: exclude=["decoder"] converted it anyway (it is listed once, as
    encoder.0), and include=["decoder"] found "no layer to convert"."""
    shared = nn.Linear(3, 3)
    net = nn.Sequential()
    net.add_module("encoder", nn.Sequential(shared, nn.ReLU()))
    net.add_module("decoder", nn.Sequential(shared))
    net.add_module("head", nn.Linear(3, 1))
    kept = pyro_bbb.bayesianize(net, exclude=["decoder"])
    assert not isinstance(kept.encoder[0], BayesianLinear) and kept.encoder[0] is kept.decoder[0]
    assert isinstance(kept.head, BayesianLinear)
    converted = pyro_bbb.bayesianize(net, include=["decoder"])
    assert isinstance(converted.decoder[0], BayesianLinear) and converted.encoder[0] is converted.decoder[0]


def test_a_frozen_layer_converted_with_the_rest_is_said():
    """A frozen (pretrained) backbone became trainable Bayesian layers without a word."""
    body = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    body[0].requires_grad_(False)
    with pytest.warns(UserWarning, match=r"\['0'\] was frozen .* exclude=\['0'\]"):
        pyro_bbb.bayesianize(body)
    body = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    body[0].requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        converted = pyro_bbb.bayesianize(body, exclude=["0"])
    assert not converted[0].weight.requires_grad


class BodyAndHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(3, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


def bayesian_layers(module):
    return [name for name, m in module.named_modules() if isinstance(m, BayesianLinear)]


def test_one_pattern_as_a_string_is_one_pattern():
    """A string was read as patterns of one character each: exclude="head" left head Bayesian (no module is named
    'h', 'e', 'a' or 'd'), include="body*" converted every layer through its '*'."""
    assert bayesian_layers(pyro_bbb.bayesianize(BodyAndHead(), exclude="head")) == ["body"]
    assert bayesian_layers(pyro_bbb.bayesianize(BodyAndHead(), include="body*")) == ["body"]
    assert bayesian_layers(pyro_bbb.bayesianize(BodyAndHead(), include="head")) == ["head"]
    with pytest.raises(TypeError, match="module-name patterns"):
        pyro_bbb.bayesianize(BodyAndHead(), exclude=[0])


def test_a_pattern_that_matches_nothing_is_an_error():
    """A misspelt exclude pattern converted the layer it meant to keep; a misspelt prior pattern left its layer at the
    default prior; an include list with one good pattern hid a misspelt other."""
    for kwargs, refusal in [({"exclude": ["haed"]}, r"exclude=\['haed'\] matched no module.*\['body', 'head'\]"),
                            ({"include": ["head", "bdoy"]}, r"include=\['bdoy'\] matched no module"),
                            ({"prior": {"haed": priors.Normal(0.0, 0.1)}}, r"prior patterns \['haed'\] match no "
                                                                           r"layer")]:
        with pytest.raises(ValueError, match=refusal):
            pyro_bbb.bayesianize(BodyAndHead(), **kwargs)
    # but a wildcard may match nothing (a recipe shared by several nets), and a prior dict names any convertible
    # layer, also one this call leaves deterministic
    assert bayesian_layers(pyro_bbb.bayesianize(BodyAndHead(), exclude=["*norm*"])) == ["body", "head"]
    both = {"body": priors.Normal(0.0, 1.0), "head": priors.Normal(0.0, 0.1)}
    assert bayesian_layers(pyro_bbb.bayesianize(BodyAndHead(), prior=both, last_layer_only=True)) == ["head"]


def test_a_prior_pattern_matches_a_shared_layer_under_any_of_its_names():
    """include and exclude see every name of a layer used at two places; a prior dict saw only the first."""

    class AutoEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(2, 2)
            self.dec = self.enc
            self.out = nn.Linear(2, 1)

        def forward(self, x):
            return self.out(self.dec(self.enc(x)))

    converted = pyro_bbb.bayesianize(AutoEncoder(), prior={"dec": priors.Normal(0.0, 0.1)})
    assert converted.enc is converted.dec and converted.enc.prior == priors.Normal(0.0, 0.1)
    assert converted.out.prior != priors.Normal(0.0, 0.1)


def test_a_lazy_layer_is_refused_until_it_has_its_sizes():
    """nn.LazyLinear was passed over without a word (and last_layer_only then made the body Bayesian)."""
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.LazyLinear(1))
    for kwargs in ({}, {"last_layer_only": True}):
        with pytest.raises(ValueError, match=r"\['2'\] is a lazy module not yet initialized.*forward pass"):
            pyro_bbb.bayesianize(net, **kwargs)
    assert bayesian_layers(pyro_bbb.bayesianize(net, include="0")) == ["0"]  # (a lazy layer left as it is)
    net(torch.randn(2, 3))
    assert bayesian_layers(pyro_bbb.bayesianize(net, last_layer_only=True)) == ["2"]


def test_a_layer_frozen_in_part_is_said():
    """A bias-only fine-tune (BitFit) freezes the weights: they became trained posteriors without a word."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    net[0].weight.requires_grad_(False)
    with pytest.warns(UserWarning, match=r"\['0 \(weight\)'\] was frozen \(requires_grad=False; in part.*"
                                         r"exclude=\['0'\]"):
        pyro_bbb.bayesianize(net)
    with pytest.warns(UserWarning, match=r"the layer passed was frozen \(requires_grad=False: its weight\).*use the "
                                         r"layer as it is"):
        pyro_bbb.bayesianize(net[0])


def test_a_plain_rnn_left_deterministic_is_said():
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.fc = torch.nn.RNN(3, 4), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.rnn(x)[0])

    with pytest.warns(UserWarning, match=r"leaves \['rnn'\] .* deterministic: only LSTM and GRU"):
        converted = pyro_bbb.bayesianize(Tagger())
    assert isinstance(converted.fc, pyro_bbb.nn.BayesianLinear)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyro_bbb.bayesianize(Tagger(), exclude=["rnn"])


def test_a_layer_whose_class_changes_how_it_is_called_is_refused():
    """A subclass's own __call__ (twice the output) was lost without a word: the twin gave half the answer."""

    class Scaled(nn.Linear):
        def __call__(self, x):
            return 2 * super().__call__(x)

    with pytest.raises(ValueError, match=r"0: Scaled has its own __call__"):
        pyro_bbb.bayesianize(nn.Sequential(Scaled(3, 1)))

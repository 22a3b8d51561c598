import math
import pickle

import numpy
import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear


def build(hidden=8, likelihood=None):
    net = torch.nn.Sequential(BayesianLinear(3, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    return pyro_bbb.BNN(net, likelihood or likelihoods.Gaussian())


def trained(tmp_path):
    x, y = torch.randn(40, 3), torch.randn(40)
    model = build()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=3, batch_size=16, progress=False, lr=0.05)
    path = tmp_path / "bnn.pt"
    pyro_bbb.save(path, model, guide)
    return model, guide, path, x


def test_round_trip_gives_the_same_predictions(tmp_path):
    model, guide, path, x = trained(tmp_path)
    pyro.set_rng_seed(1)
    before = pyro_bbb.predict(model, guide, x, num_samples=30)
    pyro.clear_param_store()
    model2 = build()
    guide2 = pyro_bbb.load(path, model2, pyro_bbb.MeanFieldGuide(model2))
    pyro.set_rng_seed(1)
    after = pyro_bbb.predict(model2, guide2, x, num_samples=30)
    torch.testing.assert_close(after.distribution.loc, before.distribution.loc, rtol=0, atol=0)
    torch.testing.assert_close(after.distribution.scale, before.distribution.scale, rtol=0, atol=0)
    torch.testing.assert_close(model2.net[2].weight, model.net[2].weight)


def test_module_local_parameters_with_a_deterministic_layer_round_trip(tmp_path):
    """Under pyro.settings.set(module_local_params=True) a deterministic layer's own nn.Parameter has no
    ``unconstrained()`` back-reference: save was an AttributeError."""
    with pyro.settings.context(module_local_params=True):
        model, guide, path, x = trained(tmp_path)
        assert len(pyro.get_param_store().keys()) == 0
        pyro.set_rng_seed(1)
        before = pyro_bbb.predict(model, guide, x, num_samples=30)
        model2 = build()
        guide2 = pyro_bbb.load(path, model2, pyro_bbb.MeanFieldGuide(model2))
        pyro.set_rng_seed(1)
        after = pyro_bbb.predict(model2, guide2, x, num_samples=30)
    torch.testing.assert_close(after.distribution.loc, before.distribution.loc, rtol=0, atol=0)
    assert torch.equal(model2.net[2].weight, model.net[2].weight)


def test_an_optimizer_keyed_by_param_store_names_is_not_saved_for_module_local_parameters(tmp_path):
    """Its get_state has no name for a module-local parameter: the file held no moments, and a resumed run restarted
    them without a word. Refused before anything is written, also for IVON's Adam (a deterministic layer's moments);
    IVON on sites alone, which it keys by name, is saved."""
    with pyro.settings.context(module_local_params=True):
        model, guide, _, x = trained(tmp_path)
        for optimizer in (pyro_bbb.optim.Adam(lr=1e-2), pyro.optim.Adam({"lr": 1e-2})):
            pyro_bbb.fit(model, guide, (x, torch.randn(40)), epochs=1, optimizer=optimizer, kl_weight=1,
                         progress=False)
            with pytest.raises(ValueError, match=r"module_local_params=True.*Save without optimizer="):
                pyro_bbb.save(tmp_path / "with_optimizer.pt", model, guide, optimizer=optimizer)
            assert not (tmp_path / "with_optimizer.pt").exists()
        ivon = pyro_bbb.optim.IVON(guide, 40)  # its Adam trains the deterministic layer: the same loss
        pyro_bbb.fit(model, guide, (x, torch.randn(40)), epochs=1, optimizer=ivon, kl_weight=1, progress=False)
        with pytest.raises(ValueError, match=r"a IVON's get_state keys"):
            pyro_bbb.save(tmp_path / "with_ivon.pt", model, guide, optimizer=ivon)
        bayesian = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))  # every parameter a site
        bayesian_guide = pyro_bbb.MeanFieldGuide(bayesian)
        ivon = pyro_bbb.optim.IVON(bayesian_guide, 40)
        pyro_bbb.fit(bayesian, bayesian_guide, (x, torch.randn(40)), epochs=1, optimizer=ivon, kl_weight=1,
                     progress=False)
        pyro_bbb.save(tmp_path / "with_ivon.pt", bayesian, bayesian_guide, optimizer=ivon)
        assert pyro_bbb.load(tmp_path / "with_ivon.pt", bayesian, bayesian_guide,
                             optimizer=pyro_bbb.optim.IVON(bayesian_guide, 40))


def test_checkpoint_is_plain_data_readable_with_weights_only(tmp_path):
    _, _, path, _ = trained(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["format"] == "pyro_bbb.checkpoint"
    assert checkpoint["settings"]["likelihood"] == "Gaussian"


def test_loading_into_another_shape_is_a_clear_error_and_changes_nothing(tmp_path):
    _, _, path, _ = trained(tmp_path)
    pyro.clear_param_store()
    other = build(hidden=5)
    guide = pyro_bbb.MeanFieldGuide(other)
    guide(torch.randn(2, 3), torch.randn(2))
    before = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    with pytest.raises(ValueError, match=r"(?s)does not fit .*net.0.weight_unconstrained.: checkpoint shape \(8, 3\)"):
        pyro_bbb.load(path, other, guide)
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())


@pytest.mark.parametrize("guide_class", [pyro.infer.autoguide.AutoDiagonalNormal,
                                         pyro.infer.autoguide.AutoLowRankMultivariateNormal])
def test_a_guide_packing_every_site_in_one_vector_is_not_loaded_into_another_architecture(tmp_path, guide_class):
    """3-4-4-1 and 3-2-8-1 nets both have 41 latent weights, so the packed guide's parameters have one shape: the
    posterior loaded into the other net without a word. The saved sites' shapes are compared."""
    def net(a, b):
        layers = torch.nn.Sequential(BayesianLinear(3, a), torch.nn.ReLU(), BayesianLinear(a, b), torch.nn.ReLU(),
                                     BayesianLinear(b, 1))
        return pyro_bbb.BNN(layers, likelihoods.Gaussian(scale=0.1))

    x, y = torch.randn(20, 3), torch.randn(20)
    model = net(4, 4)
    guide = guide_class(model)
    guide(x, y)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    other = net(2, 8)
    other_guide = guide_class(other)
    with pytest.raises(ValueError, match=r"latent site 'net.0.weight': checkpoint shape \(4, 3\), model shape "
                                         r"\(2, 3\)"):
        pyro_bbb.load(tmp_path / "m.pt", other, other_guide)
    assert len(pyro.get_param_store()) == 0
    pyro.clear_param_store()
    same = net(4, 4)
    pyro_bbb.load(tmp_path / "m.pt", same, guide_class(same))


@pytest.mark.parametrize("saved_dtype, loaded_dtype", [(torch.float32, torch.float64), (torch.float64, torch.float32)])
def test_a_checkpoint_loads_into_a_model_of_another_floating_dtype(tmp_path, saved_dtype, loaded_dtype):
    """The example rows kept their saved dtype: the model refused them, asking to cast an input the user never
    gave."""
    x, y = torch.randn(20, 3, dtype=saved_dtype), torch.randn(20, dtype=saved_dtype)
    model = build().to(saved_dtype)
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=2, kl_weight=1, progress=False)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    other = build().to(loaded_dtype)
    other_guide = pyro_bbb.load(tmp_path / "m.pt", other, pyro_bbb.MeanFieldGuide(other))
    loaded = other_guide.site_posteriors()["net.0.weight"].loc
    assert loaded.dtype == loaded_dtype
    assert torch.equal(loaded, guide.site_posteriors()["net.0.weight"].loc.detach().to(loaded_dtype))
    assert pyro_bbb.predict(other, other_guide, x[:4], num_samples=3).mean.dtype == loaded_dtype


def test_example_rows_the_model_cannot_run_name_the_checkpoint(tmp_path):
    """A checkpoint of a net on 3 inputs loaded into one on 5: torch's 'mat1 and mat2 shapes cannot be multiplied',
    naming neither the checkpoint nor the fix."""
    _, _, path, _ = trained(tmp_path)
    pyro.clear_param_store()
    wider = pyro_bbb.BNN(torch.nn.Sequential(torch.nn.Linear(5, 3), BayesianLinear(3, 8), torch.nn.ReLU(),
                                             torch.nn.Linear(8, 1)), likelihoods.Gaussian())
    with pytest.raises(ValueError, match=r"example rows '.*bnn\.pt'.*\(1, 3\).*do not run through this model.*"
                                         r"Build the model the way it was built when saved"):
        pyro_bbb.load(path, wider, pyro_bbb.MeanFieldGuide(wider))
    assert len(pyro.get_param_store()) == 0


def test_loading_with_another_likelihood_is_a_clear_error(tmp_path):
    _, _, path, _ = trained(tmp_path)
    pyro.clear_param_store()
    other = build(likelihood=likelihoods.HeteroscedasticGaussian())
    with pytest.raises(ValueError, match="likelihood 'Gaussian'"):
        pyro_bbb.load(path, other, pyro_bbb.MeanFieldGuide(other))


class Exploit:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['PWNED']).write_text('x')",))


def test_a_malicious_checkpoint_does_not_run_code(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("PWNED", str(marker))
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"format": "pyro_bbb.checkpoint", "payload": Exploit()}, f, protocol=2)
    model = build()
    with pytest.raises(ValueError, match="evil.pt.*could not be read") as error:
        pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))
    assert isinstance(error.value.__cause__, pickle.UnpicklingError)  # torch's weights_only refusal
    assert not marker.exists()


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    model = build()
    with pytest.raises(ValueError, match="not a pyro_bbb checkpoint"):
        pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))


def test_saving_an_unfitted_guide_is_an_error(tmp_path):
    model = build()
    with pytest.raises(ValueError, match="not been fitted"):
        pyro_bbb.save(tmp_path / "x.pt", model, pyro_bbb.MeanFieldGuide(model))



# -- checkpoints restore the whole model, or refuse -----------------------------------------------
class WithFeatureNet(torch.nn.Module):
    """A custom model whose feature net is registered with pyro.module, outside any PyroModule attribute."""

    def __init__(self):
        super().__init__()
        self.__dict__["features"] = torch.nn.Linear(3, 4)  # not a submodule: only Pyro's param store knows it
        self.head = BayesianLinear(4, 1)

    def forward(self, x, y=None):
        features = pyro.module("features", self.__dict__["features"])
        prior_sd = pyro.param("noise", torch.tensor(0.5), constraint=dist.constraints.positive)
        mean = self.head(torch.tanh(features(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("y", dist.Normal(mean, prior_sd), obs=y)


def test_pyro_module_and_param_store_parameters_outside_the_model_round_trip(tmp_path):
    x, y = torch.randn(30, 3), torch.randn(30)
    model = WithFeatureNet()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=20, lr=0.05, progress=False, seed=0)
    pyro.set_rng_seed(0)
    before = pyro_bbb.predict(model, guide, x, num_samples=4).mean
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    model2 = WithFeatureNet()
    guide2 = pyro_bbb.load(tmp_path / "m.pt", model2, pyro_bbb.MeanFieldGuide(model2))
    pyro.set_rng_seed(0)
    torch.testing.assert_close(pyro_bbb.predict(model2, guide2, x, num_samples=4).mean, before)


def test_priors_are_compared(tmp_path):
    """A posterior saved under N(0, 0.1) priors loaded into a model built with N(0, 1): evidence then reported its
    KL as 30.8 nats where it was trained against 22.8, and further training pulled it to the other prior."""
    from pyro_bbb import priors

    def model(scale):
        return pyro_bbb.BNN(BayesianLinear(3, 1, prior=priors.Normal(0.0, scale)), likelihoods.Gaussian(scale=0.1))

    x, y = torch.randn(20, 3), torch.randn(20)
    saved = model(0.1)
    guide = pyro_bbb.MeanFieldGuide(saved)
    guide(x, y)
    pyro_bbb.save(tmp_path / "m.pt", saved, guide)
    pyro.clear_param_store()
    other = model(1.0)
    with pytest.raises(ValueError, match=r"other priors.*net.weight Normal\(loc=0.0, scale=0.1\) saved, "
                                         r"Normal\(loc=0.0, scale=1.0\) now.*set layer.prior after loading"):
        pyro_bbb.load(tmp_path / "m.pt", other, pyro_bbb.MeanFieldGuide(other))
    assert len(pyro.get_param_store()) == 0
    same = model(0.1)
    pyro_bbb.load(tmp_path / "m.pt", same, pyro_bbb.MeanFieldGuide(same))


def test_a_prior_of_ones_own_named_by_an_address_and_a_local_latent_in_a_subsampled_plate_still_load(tmp_path):
    """A prior of one's own holding a function is shown with the function's address, another for the same prior built
    again: refused as 'another prior'. A latent per row in a subsampled data plate has the shape of the batch it was
    set up with: refused as 'another shape'. Neither is compared."""
    from pyro.infer.autoguide import AutoNormal

    from pyro_bbb.priors import Prior

    class WidthPrior(Prior):
        def __init__(self, width):
            self.width = width

        def distribution(self, shape, fan_in, *, device=None, dtype=None):
            zero = torch.zeros((), device=device, dtype=dtype)
            return dist.Normal(zero, self.width(fan_in)).expand(shape).to_event(len(shape))

    def with_width_prior():
        return pyro_bbb.BNN(BayesianLinear(3, 1, prior=WidthPrior(lambda fan_in: fan_in ** -0.5)),
                            likelihoods.Gaussian(scale=0.1))

    class PerRowNoise(pyro.nn.PyroModule):
        def forward(self, x, y):
            w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
            with pyro.plate("data", 100, subsample=torch.arange(len(x))):
                z = pyro.sample("z", dist.Normal(0.0, 1.0))
                pyro.sample("obs", dist.Normal(x @ w + z, 1.0), obs=y)

    for build, make_guide in [(with_width_prior, pyro_bbb.MeanFieldGuide), (PerRowNoise, AutoNormal)]:
        pyro.clear_param_store()
        model = build()
        guide = make_guide(model)
        guide(torch.randn(20, 3), torch.randn(20))
        pyro_bbb.save(tmp_path / "m.pt", model, guide)
        pyro.clear_param_store()
        again = build()
        pyro_bbb.load(tmp_path / "m.pt", again, make_guide(again))


def test_likelihood_settings_are_compared(tmp_path):
    x, y = torch.randn(10, 3), torch.randn(10)
    model = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    other = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    with pytest.raises(ValueError, match=r"scale=0.1.*scale=0.5"):
        pyro_bbb.load(tmp_path / "m.pt", other, pyro_bbb.MeanFieldGuide(other))


def test_save_after_a_param_store_load_writes_the_store_s_posterior(tmp_path):
    x, y = torch.randn(20, 3), torch.randn(20)
    model = build()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=5, lr=0.05, progress=False, seed=0)
    pyro.get_param_store().save(tmp_path / "store.pt")
    trained = guide.site_posteriors()["net.0.weight"].loc.clone()
    pyro_bbb.fit(model, guide, (x, y), epochs=5, lr=0.05, progress=False, seed=1)  # moves on
    pyro.get_param_store().load(tmp_path / "store.pt")  # back to the trained posterior (new tensors in the store)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    model2 = build()
    guide2 = pyro_bbb.load(tmp_path / "m.pt", model2, pyro_bbb.MeanFieldGuide(model2))
    torch.testing.assert_close(guide2.site_posteriors()["net.0.weight"].loc, trained)


def test_the_rows_a_guide_was_trained_on_are_saved_with_it(tmp_path):
    """save(..., training_rows=True): loaded, a guide fit trained at a weight of the user's on these rows trains on
    at it ("auto" chose again on rows it had seen); a checkpoint without them (the default: they are a membership
    test) leaves nothing known."""
    import warnings

    from pyro_bbb.data.provenance import fraction_seen_in_training, remember_training_inputs

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 3, generator=g), torch.randn(60, generator=g)
    model = build()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (x, y), epochs=1, kl_weight=0.1, progress=False, seed=0)
    pyro_bbb.save(tmp_path / "rows.pt", model, guide, training_rows=True)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    assert "training_rows" not in torch.load(tmp_path / "m.pt", weights_only=True)
    pyro.clear_param_store()
    model2 = build()
    guide2 = pyro_bbb.MeanFieldGuide(model2)
    remember_training_inputs(guide2, x + 5.0)  # forgotten: the checkpoint's rows replace them
    pyro_bbb.load(tmp_path / "rows.pt", model2, guide2)
    assert fraction_seen_in_training(guide2, x) == 1.0 and fraction_seen_in_training(guide2, x + 5.0) == 0.0
    with pytest.warns(UserWarning, match="an earlier fit trained it on 100% of these rows"):
        history = pyro_bbb.fit(model2, guide2, (x, y), epochs=1, progress=False, seed=0)
    assert history.kl_weight_choice.kl_weight == 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pyro_bbb.load(tmp_path / "m.pt", model2, guide2)
    assert fraction_seen_in_training(guide2, x) is None


def _saved(tmp_path):
    x, y = torch.randn(10, 3), torch.randn(10)
    model = build()
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    return tmp_path / "m.pt"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_settings", "nan", "num_data", "kl_weight_nan",
                                    "kl_weight_negative", "kl_weight_unpaired", "kl_weight_chosen_by",
                                    "training_rows", "latent_shapes", "priors", "flipped_bit"])
def test_damaged_checkpoints_are_one_clear_error_naming_the_file(tmp_path, damage):
    path = _saved(tmp_path)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a checkpoint at all" * 10)
    elif damage == "flipped_bit":  # the sign of a weight's mean: torch.load does not check the zip's CRC-32s
        data = bytearray(path.read_bytes())
        loc = pyro.get_param_store()["MeanFieldGuide.locs.net.0.weight"].detach().numpy().tobytes()
        assert data.count(loc) >= 1
        at = data.find(loc)
        data[at + 3] ^= 0x80
        path.write_bytes(bytes(data))
    else:
        checkpoint = torch.load(path, weights_only=True)
        if damage == "no_settings":
            del checkpoint["settings"]
        elif damage == "num_data":
            checkpoint["settings"]["num_data"] = -3
        elif damage == "training_rows":
            checkpoint["training_rows"] = torch.zeros(3)
        elif damage == "latent_shapes":
            checkpoint["latent_shapes"] = {"net.0.weight": "eight by three"}
        elif damage == "priors":
            checkpoint["settings"]["priors"] = {"net.0.weight": 0.1}
        elif damage.startswith("kl_weight"):  # a record that loaded, shown as "KL weight -3 ... tempered"
            checkpoint["kl_weight_choice"] = {
                "kl_weight_nan": {"kl_weight": math.nan}, "kl_weight_negative": {"kl_weight": -3.0},
                "kl_weight_unpaired": {"kl_weight": 0.5, "chosen_by": "validation", "validation_nll": [[1.0]]},
                "kl_weight_chosen_by": {"kl_weight": 0.5, "chosen_by": "martians"}}[damage]
        else:
            next(iter(checkpoint["guide_state"].values())).fill_(math.nan)
        torch.save(checkpoint, path)
    pyro.clear_param_store()
    model = build()
    guide = pyro_bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match=r"m\.pt" + (".*damaged.*KL weight" if damage.startswith("kl") else "")):
        pyro_bbb.load(path, model, guide)
    assert len(pyro.get_param_store()) == 0  # nothing was set up or loaded


@pytest.mark.parametrize("optimizer_class", ["Adam", "IVON"])
def test_a_run_resumed_from_a_checkpoint_with_its_optimizer_continues_as_before(tmp_path, optimizer_class):
    """save(..., optimizer=) and load(..., optimizer=) carry the optimizer's state by parameter name: three epochs, a
    checkpoint, three more epochs in fresh objects equal the same six epochs in one process (and a fresh optimizer,
    whose moments restart, does not)."""
    x, y = torch.randn(40, 3), torch.randn(40)

    def build():
        bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
        guide = pyro_bbb.MeanFieldGuide(bnn)
        make = {"Adam": lambda: pyro_bbb.optim.Adam(lr=1e-2), "IVON": lambda: pyro_bbb.optim.IVON(guide, 40)}
        return bnn, guide, make[optimizer_class]()

    def loc():
        return pyro.get_param_store()["MeanFieldGuide.locs.net.weight"].detach().clone()

    pyro.clear_param_store()
    bnn, guide, optimizer = build()
    pyro_bbb.fit(bnn, guide, (x, y), epochs=3, optimizer=optimizer, progress=False, seed=0)
    path = tmp_path / "run.pt"
    pyro_bbb.save(path, bnn, guide, optimizer=optimizer)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=3, optimizer=optimizer, progress=False, seed=1)
    uninterrupted = loc()

    results = {}
    for restore in (True, False):
        pyro.clear_param_store()
        bnn, guide, optimizer = build()
        pyro_bbb.load(path, bnn, guide, optimizer=optimizer if restore else None)
        pyro_bbb.fit(bnn, guide, (x, y), epochs=3, optimizer=optimizer, progress=False, seed=1)
        results[restore] = loc()
    assert torch.equal(results[True], uninterrupted)
    assert not torch.equal(results[False], uninterrupted)
    with pytest.raises(ValueError, match="holds the state of a"):
        other = pyro_bbb.optim.IVON(guide, 40) if optimizer_class == "Adam" else pyro_bbb.optim.Adam()
        pyro_bbb.load(path, bnn, guide, optimizer=other)
    pyro_bbb.save(tmp_path / "without.pt", bnn, guide)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        pyro_bbb.load(tmp_path / "without.pt", bnn, guide, optimizer=optimizer)


def pyro_loop_checkpoint(tmp_path, num_data=40):
    """A BNN trained by Pyro's own SVI loop on minibatches, its N declared by ``num_data``, saved."""
    pyro.set_rng_seed(0)
    x, y = torch.randn(num_data, 3), torch.randn(num_data)
    model = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5), num_data=num_data)
    guide = pyro_bbb.MeanFieldGuide(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    for _ in range(3):
        svi.step(x[:10], y[:10])
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    return tmp_path / "m.pt", x, y


def test_a_model_built_without_num_data_gets_the_saved_one_and_its_pyro_loss_is_as_before(tmp_path):
    path, x, y = pyro_loop_checkpoint(tmp_path)
    pyro.clear_param_store()
    model = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5), num_data=40)
    guide = pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))
    pyro.set_rng_seed(3)
    expected = pyro.infer.Trace_ELBO().loss(model, guide, x[:10], y[:10])
    pyro.clear_param_store()
    model2 = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    guide2 = pyro_bbb.load(path, model2, pyro_bbb.MeanFieldGuide(model2))
    assert model2.num_data == 40
    pyro.set_rng_seed(3)
    assert pyro.infer.Trace_ELBO().loss(model2, guide2, x[:10], y[:10]) == pytest.approx(expected, rel=1e-6)


def test_the_num_data_an_earlier_load_set_is_replaced_by_the_next_load(tmp_path):
    """Loading a checkpoint with N = 40 and then one with N = 25 (or none) into one BNN kept 40: Pyro's own ELBOs
    then weighed the second posterior's likelihood by the first's N."""
    path, _, _ = pyro_loop_checkpoint(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    path25, _, _ = pyro_loop_checkpoint(other, num_data=25)
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (torch.randn(10, 3), torch.randn(10)), epochs=1, kl_weight=1, progress=False)
    pyro_bbb.save(tmp_path / "none.pt", bnn, guide)
    pyro.clear_param_store()
    model = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(model)
    for checkpoint, expected in [(path, 40), (path25, 25), (tmp_path / "none.pt", None), (path, 40)]:
        pyro_bbb.load(checkpoint, model, guide)
        assert model.num_data == expected
    model.num_data = 500  # the user's own from here on
    pyro_bbb.load(path25, model, guide)
    assert model.num_data == 500


def test_a_model_built_with_its_own_num_data_keeps_it_to_fine_tune_on_other_data(tmp_path):
    path, x, y = pyro_loop_checkpoint(tmp_path)
    pyro.clear_param_store()
    model = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5), num_data=500)
    pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))
    assert model.num_data == 500


class WithNumData(torch.nn.Module):
    """A hand-written model that keeps a ``num_data`` of its own kind: saved only when it is a whole number."""

    def __init__(self, num_data):
        super().__init__()
        self.num_data = num_data
        self.net = build()

    def forward(self, x, y=None):
        return self.net(x, y)


@pytest.mark.parametrize("num_data", [40.0, "forty", numpy.int64(40)])
def test_a_hand_written_model_s_num_data_of_any_kind_saves_and_loads(tmp_path, num_data):
    x, y = torch.randn(10, 3), torch.randn(10)
    model = WithNumData(num_data)
    guide = pyro_bbb.MeanFieldGuide(model)
    guide(x, y)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    saved = torch.load(tmp_path / "m.pt", weights_only=True)["settings"]["num_data"]
    assert saved == (40 if isinstance(num_data, numpy.integer) else None) and type(saved) in (int, type(None))
    pyro.clear_param_store()
    model2 = WithNumData(None)
    pyro_bbb.load(tmp_path / "m.pt", model2, pyro_bbb.MeanFieldGuide(model2))
    assert model2.num_data == saved


def test_a_model_saved_without_num_data_leaves_the_loaded_model_s_own(tmp_path):
    _, _, path, _ = trained(tmp_path)  # fit owns N: the model's num_data stays None
    assert torch.load(path, weights_only=True)["settings"]["num_data"] is None
    pyro.clear_param_store()
    model = build()
    model.num_data = 40
    pyro_bbb.load(path, model, pyro_bbb.MeanFieldGuide(model))
    assert model.num_data == 40


def _batch_norm_model():
    net = torch.nn.Sequential(BayesianLinear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), BayesianLinear(8, 1))
    return pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))


def test_save_load_and_evidence_leave_batch_norm_alone_and_take_batch_norm_1d(tmp_path):
    """They ran the model in training mode on one example row: each save moved the running statistics (and so the
    predictions), evidence moved them 200 times, and a BatchNorm1d model could not be saved or loaded at all."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(100, 3), torch.randn(100)
    bnn = _batch_norm_model()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=2, batch_size=50, progress=False, kl_weight=1)
    statistics = {name: value.clone() for name, value in bnn.net[1].named_buffers()}  # the batch norm's
    pyro_bbb.save(tmp_path / "bn.pt", bnn, guide)
    pyro_bbb.evidence(bnn, guide, (x, y), num_draws=5)
    for name, value in bnn.net[1].named_buffers():
        assert torch.equal(value, statistics[name]), name
    pyro.clear_param_store()
    fresh = _batch_norm_model()
    pyro_bbb.load(tmp_path / "bn.pt", fresh, pyro_bbb.MeanFieldGuide(fresh))
    for name, value in fresh.net[1].named_buffers():
        assert torch.equal(value, statistics[name]), name


def test_a_buffer_that_is_infinite_by_design_round_trips_and_an_infinite_parameter_is_refused(tmp_path):
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.tensor([0.0, float("-inf")]))  # e.g. a causal mask
            self.scale = torch.nn.Parameter(torch.ones(2))
            self.out = BayesianLinear(2, 1)

        def forward(self, x):
            return self.out(x * torch.softmax(self.mask, -1) * self.scale)

    pyro.clear_param_store()
    x, y = torch.randn(20, 2), torch.randn(20)
    bnn = pyro_bbb.BNN(Masked(), likelihoods.Gaussian(scale=0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=1, progress=False, kl_weight=1)
    pyro_bbb.save(tmp_path / "masked.pt", bnn, guide)
    pyro.clear_param_store()
    fresh = pyro_bbb.BNN(Masked(), likelihoods.Gaussian(scale=0.5))
    pyro_bbb.load(tmp_path / "masked.pt", fresh, pyro_bbb.MeanFieldGuide(fresh))
    assert torch.equal(fresh.net.mask, bnn.net.mask)
    with torch.no_grad():
        bnn.net.scale[0] = float("inf")
    pyro_bbb.save(tmp_path / "diverged.pt", bnn, guide)
    pyro.clear_param_store()
    fresh = pyro_bbb.BNN(Masked(), likelihoods.Gaussian(scale=0.5))
    with pytest.raises(ValueError, match=r"infinite values in the model parameters \['net.scale'\]"):
        pyro_bbb.load(tmp_path / "diverged.pt", fresh, pyro_bbb.MeanFieldGuide(fresh))
    assert len(pyro.get_param_store()) == 0


def test_a_checkpoint_goes_through_a_file_object_as_torch_save_takes():
    """save and load took paths only: a BytesIO (a checkpoint kept in memory or sent to a store) failed in load with
    "expected str, bytes or os.PathLike object, not BytesIO"."""
    import io

    def make():
        return pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))

    buffer = io.BytesIO()
    guide = _fitted_and_saved(make(), buffer)
    buffer.seek(0)
    bnn = make()
    loaded = pyro_bbb.load(buffer, bnn, pyro_bbb.MeanFieldGuide(bnn))
    for name, posterior in guide.site_posteriors().items():
        assert torch.equal(loaded.site_posteriors()[name].loc, posterior.loc)
        assert torch.equal(loaded.site_posteriors()[name].scale, posterior.scale)
    pyro.clear_param_store()
    bnn = make()
    with pytest.raises(ValueError, match="the file object BytesIO could not be read as a pyro_bbb checkpoint"):
        pyro_bbb.load(io.BytesIO(buffer.getvalue()[:100]), bnn, pyro_bbb.MeanFieldGuide(bnn))


def _fitted_and_saved(bnn, path):
    """A guide fitted one epoch on 30 random rows of 3 features and saved with ``bnn`` to ``path``; the param store
    is left empty."""
    pyro.clear_param_store()
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (torch.randn(30, 3), torch.randn(30)), epochs=1, progress=False, kl_weight=1)
    pyro_bbb.save(path, bnn, guide)
    pyro.clear_param_store()
    return guide


def test_a_refused_load_leaves_the_param_store_as_it_was_so_the_right_model_loads_next(tmp_path):
    def make(width):
        return pyro_bbb.BNN(torch.nn.Sequential(BayesianLinear(3, width), torch.nn.ReLU(), BayesianLinear(width, 1)),
                            likelihoods.Gaussian(scale=0.5))

    guide = _fitted_and_saved(make(8), tmp_path / "eight.pt")
    wrong = make(16)
    with pytest.raises(ValueError, match="does not fit this model"):
        pyro_bbb.load(tmp_path / "eight.pt", wrong, pyro_bbb.MeanFieldGuide(wrong))
    assert len(pyro.get_param_store()) == 0
    right = make(8)
    right_guide = pyro_bbb.load(tmp_path / "eight.pt", right, pyro_bbb.MeanFieldGuide(right))
    torch.testing.assert_close(right_guide.site_posteriors()["net.0.weight"].loc,
                               guide.site_posteriors()["net.0.weight"].loc)


def test_a_load_refused_late_or_by_torch_leaves_the_param_store_as_it_was(tmp_path):
    """The clean-up ran for the shape check's ValueError only: a model that cannot run the example rows (torch's
    RuntimeError) or a refused optimizer state left the wrong set-up's entries in the store."""
    def make(width):
        net = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(4, 2),
                                  BayesianLinear(2, 1))
        return pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))

    _fitted_and_saved(make(4), tmp_path / "four.pt")
    wrong = make(5)
    with pytest.raises(ValueError, match="do not run through this model"):
        pyro_bbb.load(tmp_path / "four.pt", wrong, pyro_bbb.MeanFieldGuide(wrong))
    assert len(pyro.get_param_store()) == 0
    right = make(4)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        pyro_bbb.load(tmp_path / "four.pt", right, pyro_bbb.MeanFieldGuide(right), optimizer=pyro_bbb.optim.Adam())
    assert len(pyro.get_param_store()) == 0
    pyro_bbb.load(tmp_path / "four.pt", right, pyro_bbb.MeanFieldGuide(right))


def test_load_leaves_the_callers_random_stream_alone(tmp_path):
    """Its guide's set-up drew from torch's global stream: a seeded predict after load gave other numbers."""
    model, guide, path, x = trained(tmp_path)
    pyro.clear_param_store()
    fresh = build()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    pyro_bbb.load(path, fresh, pyro_bbb.MeanFieldGuide(fresh))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("tied", [False, True])
def test_a_checkpoint_that_kept_a_frozen_layer_in_the_param_store_loads_into_its_buffers(tmp_path, tied):
    """An earlier BNN kept a frozen layer's parameters in Pyro's param store (and trained them); BNN now holds them
    as buffers, and such a checkpoint was refused ("'net.0.weight' is in the checkpoint but not in the parameter").
    It loads, with the param store's values (those the saved model ran on); a weight two layers share (saved under
    both names) too."""
    def frozen_model():
        net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3), torch.nn.ReLU(),
                                  BayesianLinear(3, 1))
        if tied:
            net[2].weight = net[0].weight
        net[0].requires_grad_(False)
        return pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.5))

    model = frozen_model()
    guide = pyro_bbb.MeanFieldGuide(model)
    pyro_bbb.fit(model, guide, (torch.randn(40, 3), torch.randn(40)), epochs=2, kl_weight=1, progress=False)
    pyro_bbb.save(tmp_path / "m.pt", model, guide)
    checkpoint = torch.load(tmp_path / "m.pt", weights_only=True)
    names = ("net.0.weight", "net.0.bias", "net.2.weight") if tied else ("net.0.weight", "net.0.bias")
    trained_by_the_old_version = {name: checkpoint["model_state"][name] + 0.5 for name in names}
    checkpoint["param_store"].update(trained_by_the_old_version)
    torch.save(checkpoint, tmp_path / "old.pt")

    pyro.clear_param_store()
    loaded = frozen_model()
    pyro_bbb.load(tmp_path / "old.pt", loaded, pyro_bbb.MeanFieldGuide(loaded))
    torch.testing.assert_close(loaded.net[0].weight, trained_by_the_old_version["net.0.weight"], rtol=0, atol=0)
    torch.testing.assert_close(loaded.net[0].bias, trained_by_the_old_version["net.0.bias"], rtol=0, atol=0)
    assert "net.0.weight" not in pyro.get_param_store().keys()
    assert (loaded.net[2].weight is loaded.net[0].weight) == tied

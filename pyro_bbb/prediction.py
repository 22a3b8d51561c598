"""``predict``: the posterior predictive distribution from S weight draws, computed in one vectorized pass.

Example
-------
>>> import torch, pyro
>>> from pyro_bbb import BNN, MeanFieldGuide, likelihoods
>>> from pyro_bbb.nn import BayesianLinear
>>> pyro.clear_param_store()
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> guide = MeanFieldGuide(bnn)
>>> _ = guide(torch.randn(8, 3), torch.randn(8))   # normally done by pyro_bbb.fit
>>> pred = predict(bnn, guide, torch.randn(20, 3), num_samples=50)
>>> pred.mean.shape, pred.samples.shape
(torch.Size([20]), torch.Size([50, 20]))
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch

from .checks import check_count, data_plate_of, is_set_up
from .handlers import ObservationPlaceholderMessenger, SubsampleCoverMessenger
from .inputs import as_tensor, cast_inputs, model_dtype, targets_like
from .nn.module import data_plate_named
from .priors import strip_independent

__all__ = ["predict", "set_up_guide", "Prediction", "RegressionPrediction", "ClassificationPrediction"]

SAMPLE_PLATE = "_predictive_samples"


class Prediction:
    """Posterior predictive of a batch of inputs: one likelihood per weight draw, and predictive samples.

    Attributes
    ----------
    distribution : Distribution
        The likelihood under each weight draw; batch shape ``(S, batch)``.
    samples : Tensor
        One predictive draw of the targets per weight draw, shape ``(S, batch, *event)``.

    Example
    -------
    >>> p = Prediction(dist.Normal(torch.zeros(4, 2), 1.0), torch.zeros(4, 2))
    >>> p.num_samples, len(p)
    (4, 2)
    """

    def __init__(self, distribution: dist.Distribution, samples: torch.Tensor):
        self.distribution = distribution
        self.samples = samples

    @property
    def num_samples(self) -> int:
        """Number of weight draws S."""
        return self.distribution.batch_shape[0]

    def __len__(self) -> int:
        return self.distribution.batch_shape[1]

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``log p(y | x, w_s)`` for every draw s and datum: shape ``(S, batch)`` (``(batch, 1)`` targets of scalar
        predictions are read as ``(batch,)``)."""
        y = targets_like(as_tensor(y, "y").to(self.samples.device), self.samples.shape[1:])
        if y.shape != self.samples.shape[1:]:
            raise ValueError(f"the prediction needs targets of shape {tuple(self.samples.shape[1:])}, but y has "
                             f"shape {tuple(y.shape)}.")  # fmt: skip
        return self.distribution.log_prob(y)

    def log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """Log posterior predictive density per datum: ``log mean_s p(y | x, w_s)``, shape ``(batch,)``."""
        return torch.logsumexp(self.log_prob(y), 0) - math.log(self.num_samples)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_samples={self.num_samples}, batch={len(self)})"


def _normal_parts(distribution: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    base = strip_independent(distribution)
    return base.loc, base.scale


class RegressionPrediction(Prediction):
    """Prediction under a Gaussian likelihood: moments and intervals of the Gaussian mixture over weight draws.

    Example
    -------
    >>> loc = torch.tensor([[0.0], [2.0]])              # two weight draws, one input
    >>> p = RegressionPrediction(dist.Normal(loc, 1.0), loc)
    >>> p.mean, p.epistemic_std, p.aleatoric_std
    (tensor([1.]), tensor([1.]), tensor([1.]))
    >>> [round(float(t), 3) for t in p.interval(0.9)]
    [-1.284, 3.284]
    """

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean: the mean of the network's mean over draws."""
        return _normal_parts(self.distribution)[0].mean(0)

    @property
    def epistemic_std(self) -> torch.Tensor:
        """Standard deviation of the network's mean across weight draws (model uncertainty)."""
        return _normal_parts(self.distribution)[0].std(0, correction=0)

    @property
    def aleatoric_std(self) -> torch.Tensor:
        """Root mean noise variance across draws (data noise)."""
        return _normal_parts(self.distribution)[1].pow(2).mean(0).sqrt()

    @property
    def std(self) -> torch.Tensor:
        """Total predictive standard deviation: ``sqrt(epistemic^2 + aleatoric^2)``."""
        return (self.epistemic_std.pow(2) + self.aleatoric_std.pow(2)).sqrt()

    def quantile(self, q: float) -> torch.Tensor:
        """The ``q``-quantile of the predictive mixture, per datum (bisection on its CDF, to 1e-6 of the range)."""
        if not 0 < q < 1:
            raise ValueError(f"a quantile level must lie strictly between 0 and 1, got {q!r}.")
        loc, scale = _normal_parts(self.distribution)
        dtype = loc.dtype
        loc, scale = loc.double(), scale.double()
        lower = (loc - 10 * scale).min(0).values
        upper = (loc + 10 * scale).max(0).values
        for _ in range(int(math.ceil(math.log2(1e6))) + 2):
            mid = (lower + upper) / 2
            below = torch.special.ndtr((mid - loc) / scale).mean(0) < q
            lower, upper = torch.where(below, mid, lower), torch.where(below, upper, mid)
        return ((lower + upper) / 2).to(dtype)

    def interval(self, level: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
        """Central predictive interval holding probability ``level``: ``(lower, upper)``."""
        if not 0 < level < 1:
            raise ValueError(f"`level` must lie strictly between 0 and 1, got {level!r}.")
        return self.quantile((1 - level) / 2), self.quantile((1 + level) / 2)


def _entropy(probs: torch.Tensor, binary: bool) -> torch.Tensor:
    if binary:
        probs = torch.stack([1 - probs, probs], -1)
    return -(probs * probs.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum(-1)


class ClassificationPrediction(Prediction):
    """Prediction under a Categorical or Bernoulli likelihood, with the entropy decomposition of uncertainty.

    ``predictive_entropy = expected_entropy (aleatoric) + mutual_information (epistemic)``.

    Example
    -------
    >>> logits = torch.tensor([[[2.0, -2.0]], [[-2.0, 2.0]]])   # two draws that disagree about one input
    >>> p = ClassificationPrediction(dist.Categorical(logits=logits), torch.zeros(2, 1))
    >>> p.probs
    tensor([[0.5000, 0.5000]])
    >>> round(float(p.mutual_information), 2), round(float(p.expected_entropy), 2)
    (0.6, 0.09)
    """

    @property
    def binary(self) -> bool:
        return isinstance(self.distribution, dist.Bernoulli)

    @property
    def draw_probs(self) -> torch.Tensor:
        """Class probabilities under each draw: ``(S, batch, C)`` (``(S, batch)`` for Bernoulli: P(y = 1))."""
        return self.distribution.probs

    @property
    def probs(self) -> torch.Tensor:
        """Predictive class probabilities: ``(batch, C)`` (``(batch,)`` for Bernoulli)."""
        return self.draw_probs.mean(0)

    @property
    def predicted_class(self) -> torch.Tensor:
        """The most probable class per input."""
        return (self.probs > 0.5).long() if self.binary else self.probs.argmax(-1)

    @property
    def predictive_entropy(self) -> torch.Tensor:
        """Entropy of the predictive probabilities (total uncertainty), nats."""
        return _entropy(self.probs, self.binary)

    @property
    def expected_entropy(self) -> torch.Tensor:
        """Mean entropy of each draw's probabilities (aleatoric uncertainty), nats."""
        return _entropy(self.draw_probs, self.binary).mean(0)

    @property
    def mutual_information(self) -> torch.Tensor:
        """Mutual information between the label and the weights (epistemic uncertainty), nats."""
        return (self.predictive_entropy - self.expected_entropy).clamp_min(0)


# -- stacking per-draw likelihoods ------------------------------------------------------------------------------
_FAMILIES: dict[type, tuple[tuple[str, ...], Callable]] = {
    dist.Normal: (("loc", "scale"), lambda p: dist.Normal(p["loc"], p["scale"])),
    dist.Categorical: (("logits",), lambda p: dist.Categorical(logits=p["logits"])),
    dist.Bernoulli: (("logits",), lambda p: dist.Bernoulli(logits=p["logits"])),
}


def _family(fn: dist.Distribution) -> tuple[dist.Distribution, int]:
    reinterpreted = 0
    while isinstance(fn, dist.Independent):
        reinterpreted += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    for cls in _FAMILIES:
        if isinstance(fn, cls):
            return fn, reinterpreted
    raise ValueError(
        f"predict understands Normal, Categorical and Bernoulli observations, but the model's observation is "
        f"{type(fn).__name__}. Use a pyro_bbb.likelihoods likelihood, or subclass Likelihood and Prediction."
    )


def _params(fn: dist.Distribution, site: dict, draw_dims: int) -> tuple[type, int, dict[str, torch.Tensor]]:
    """The parameters of a site's ``fn``: ``draw_dims`` leading draw dims, then only the site's own plate dims.

    Under the sample plate the batch is ``(S, 1, ..., 1, *plates)``; the padding between goes.
    """
    base, reinterpreted = _family(fn)
    names, _ = next(v for k, v in _FAMILIES.items() if isinstance(base, k))
    batch = base.batch_shape
    keep = batch[:draw_dims] + batch[len(batch) - reinterpreted - _site_plate_dims(site) :]
    params = {}
    for name in names:
        value = getattr(base, name).expand(batch + getattr(base, name).shape[len(batch) :])
        params[name] = value.reshape(keep + value.shape[len(batch) :])
    return type(base), reinterpreted, params


def _rebuild(family: type, reinterpreted: int, params: dict[str, torch.Tensor]) -> dist.Distribution:
    fn = next(v for k, v in _FAMILIES.items() if issubclass(family, k))[1](params)
    return fn.to_event(reinterpreted) if reinterpreted else fn


def _prediction_for(distribution: dist.Distribution, samples: torch.Tensor) -> Prediction:
    base, _ = _family(distribution)
    if isinstance(base, dist.Normal):
        return RegressionPrediction(distribution, samples)
    return ClassificationPrediction(distribution, samples)


# -- the passes ------------------------------------------------------------------------------------------------
def _site_plate_dims(site: dict) -> int:
    dims = [-f.dim for f in site["cond_indep_stack"] if f.vectorized and f.name != SAMPLE_PLATE]
    return max(dims, default=0)


def _observation_site(model_trace, guide_trace, data_plate: str) -> str:
    names = [
        name
        for name, site in model_trace.iter_stochastic_nodes()
        if name not in guide_trace.nodes and any(f.name == data_plate for f in site["cond_indep_stack"])
    ]
    if len(names) != 1:
        raise ValueError(
            f"predict needs exactly one observation site inside pyro.plate({data_plate!r}) that the guide does not "
            f"sample; the model has {names or 'none'}. Build the model as pyro_bbb.BNN(net, likelihood), or name "
            "your data plate with `data_plate=`."
        )
    return names[0]


#: On a CPU, weight draws are run in blocks whose activations hold about this many numbers (8 MB of float32):
#: beyond the cache, one huge batched product is slower than several smaller ones (benchmarks/predict.py).
CPU_BLOCK_ELEMENTS = 2**21


def _draws_per_block(num_samples: int, x: torch.Tensor, shapes: dict[str, torch.Size]) -> int:
    """How many weight draws to run together: all of them on an accelerator; cache-sized blocks on a CPU.

    The activations per input and draw are estimated from the weights: a linear layer's output features, a
    convolution's output channels times the input's positions (``x[0].numel() / channels``)."""
    if x.device.type != "cpu":
        return num_samples
    positions = x[0].numel() // x.shape[1] if x.dim() > 2 else 1
    width = sum(shape[0] * (positions if len(shape) > 2 else 1) for shape in shapes.values() if len(shape) >= 2)
    return max(1, min(num_samples, CPU_BLOCK_ELEMENTS // (x.shape[0] * (width or 1))))


def _run_draws(model, draws, shapes, x, obs, data_plate: str, nesting: int, block: int | None, num_samples: int):
    """The observation's parameters under every draw: ``block`` draws per call inside a sample plate, or one call
    per draw without any plate (``block=None``, the fallback for models that cannot be vectorized)."""
    parts = []
    for start in range(0, num_samples, block or 1):
        stop = min(start + (block or 1), num_samples)
        placeholder = ObservationPlaceholderMessenger(data_plate, x.device)
        if block is None:
            values = {name: value[start].reshape(shapes[name]) for name, value in draws.items()}
            trace = poutine.trace(placeholder(poutine.condition(model, data=values))).get_trace(x)
        else:
            values = {name: value[start:stop] for name, value in draws.items()}
            with pyro.plate(SAMPLE_PLATE, stop - start, dim=-(nesting + 1)):
                trace = poutine.trace(placeholder(poutine.condition(model, data=values))).get_trace(x)
        site = trace.nodes[obs]
        family, reinterpreted, params = _params(site["fn"], site, draw_dims=0 if block is None else 1)
        parts.append({k: v.unsqueeze(0) for k, v in params.items()} if block is None else params)
    return family, reinterpreted, {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _run_covering(model, draws, shapes, x, obs, data_plate: str, nesting: int, block, num_samples: int, pieces=None):
    """:func:`_run_draws` over every input: a data plate that subsamples is run piece by piece (its full size
    covered once, in order) and the pieces joined; ``pieces`` limits how many are run."""
    parts, piece = [], 0
    while True:
        cover = SubsampleCoverMessenger(data_plate, piece)
        family, reinterpreted, params = _run_draws(cover(model), draws, shapes, x, obs, data_plate, nesting, block,
                                                   num_samples)  # fmt: skip
        if cover.size is None:
            return family, reinterpreted, params
        keep = min(cover.subsample_size, cover.size - piece * cover.subsample_size)
        parts.append({name: value[:, :keep] for name, value in params.items()})
        piece += 1
        if piece * cover.subsample_size >= cover.size or (pieces is not None and piece >= pieces):
            return family, reinterpreted, {name: torch.cat([p[name] for p in parts], 1) for name in parts[0]}


def _vectorized_mismatch(result, alone: dict[str, torch.Tensor]) -> str | None:
    """Draw 0 of a vectorized pass against the same draw run alone (``alone``: the observation's parameters of the
    plain pass): a model whose code reads the draw dimensions as its batch gives other numbers, and is then run one
    draw at a time rather than trusted."""
    _, _, vectorized = result
    for name, value in alone.items():
        first = vectorized[name][:1, : value.shape[1]] if value.dim() > 1 else vectorized[name][:1]  # piece 0
        if value.shape[1:] != first.shape[1:]:
            return (f"the vectorized draws gave the observation's {name!r} shape {tuple(vectorized[name].shape[1:])} "
                    f"per draw, one draw alone {tuple(value.shape[1:])}")  # fmt: skip
        if not torch.allclose(first, value, rtol=1e-4, atol=1e-5):
            return f"the vectorized draws gave other values of the observation's {name!r} than one draw alone"
    return None


def set_up_guide(model: Callable, guide: Callable, x: torch.Tensor) -> None:
    """Set up an autoguide that has not seen the model yet (e.g. a converted or MOPED-initialised model before any
    VI) from inputs alone: the observation is given a placeholder value drawn from the model (so that Pyro does not
    take it for a latent variable), and the user's random stream is left where it was.

    Example
    -------
    >>> import pyro
    >>> from pyro_bbb import BNN, MeanFieldGuide, likelihoods
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> bnn = BNN(BayesianLinear(3, 2), likelihoods.Categorical())
    >>> guide = MeanFieldGuide(bnn)
    >>> set_up_guide(bnn, guide, torch.randn(1, 3))
    >>> sorted(name for name, _ in guide.prototype_trace.iter_stochastic_nodes())
    ['net.bias', 'net.weight']
    """
    data_plate = data_plate_of(model)
    with torch.random.fork_rng(devices=[]), torch.no_grad(), poutine.block():
        trace = poutine.trace(model).get_trace(x)
        observations = [site["value"] for site in trace.nodes.values()
                        if site["type"] == "sample" and any(f.name == data_plate for f in site["cond_indep_stack"])]
        guide(x, *observations[:1])  # fmt: skip


def _check_predict_args(guide, x, num_samples, batch_size, sample_batch_size) -> None:
    check_count("num_samples", num_samples)
    check_count("batch_size", batch_size, optional=True)
    check_count("sample_batch_size", sample_batch_size, optional=True)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}.")
    if x.dim() == 0 or x.shape[0] == 0:
        raise ValueError(f"x must hold at least one input along its first dimension, got shape {tuple(x.shape)}.")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("x contains NaN or infinite values; predictions for them would be NaN.")


@torch.no_grad()
def predict(
    model: Callable,
    guide: Callable,
    x: torch.Tensor,
    num_samples: int = 100,
    batch_size: int | None = None,
    *,
    vectorize: bool | None = None,
    sample_batch_size: int | None = None,
    data_plate: str | None = None,
) -> Prediction:
    """The posterior predictive at inputs ``x`` from ``num_samples`` weight draws of ``guide``.

    The weights are drawn once; every input (and every chunk of ``batch_size`` inputs) sees the same S draws. The
    model runs for many draws at once inside a sample plate (all S on an accelerator; on a CPU, blocks of draws
    whose activations fit the cache); when it cannot (e.g. a deterministic layer that rejects extra leading
    dimensions) it falls back, with a warning, to one call per draw. Both give the same numbers. The predictive
    samples are drawn last, from the stacked likelihoods.

    Parameters
    ----------
    model : callable
        Called as ``model(x)``; it must sample its observation inside ``pyro.plate(data_plate)``, e.g. a
        :class:`pyro_bbb.BNN`.
    guide : callable
        A fitted guide such as :class:`pyro_bbb.MeanFieldGuide`.
    x : Tensor
        Inputs, first dimension the batch.
    num_samples : int
        Number of weight draws S.
    batch_size : int, optional
        Inputs per model call (memory bound); ``None`` runs all of ``x`` at once.
    vectorize : bool, optional
        ``True`` only vectorized, ``False`` only the loop, ``None`` vectorized with the loop as fallback.
    sample_batch_size : int, optional
        Weight draws per vectorized call; by default all on an accelerator and a cache-sized block on a CPU.
    data_plate : str, optional
        Name of the data plate; defaults to ``model.data_plate`` or ``"data"``.

    Returns
    -------
    Prediction
        The model's likelihood decides the kind: :class:`RegressionPrediction` (``mean``, ``std``,
        ``aleatoric_std``, ``epistemic_std``, ``interval``) or :class:`ClassificationPrediction` (``probs``,
        ``predictive_entropy``, ``expected_entropy``, ``mutual_information``, ``predicted_class``).

    Example
    -------
    >>> import pyro
    >>> from pyro_bbb import BNN, MeanFieldGuide, likelihoods
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> bnn = BNN(BayesianLinear(4, 3), likelihoods.Categorical())
    >>> guide = MeanFieldGuide(bnn)
    >>> _ = guide(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    >>> predict(bnn, guide, torch.randn(10, 4), num_samples=20, batch_size=4).probs.shape
    torch.Size([10, 3])
    """
    return predict_with_draws(model, guide, x, num_samples, batch_size, vectorize, sample_batch_size, data_plate)[0]


@torch.no_grad()
def predict_with_draws(
    model, guide, x, num_samples=100, batch_size=None, vectorize=None, sample_batch_size=None, data_plate=None
) -> tuple[Prediction, dict[str, torch.Tensor], str]:
    """:func:`predict`, also returning the weight draws it used (``{site: (S, *site shape)}``) and the name of
    the observation site -- so that an export can show the very draws behind the predictive.

    Example
    -------
    >>> import pyro
    >>> from pyro_bbb import BNN, MeanFieldGuide, likelihoods
    >>> from pyro_bbb.nn import BayesianLinear
    >>> pyro.clear_param_store()
    >>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.1))
    >>> guide = MeanFieldGuide(bnn)
    >>> _ = guide(torch.zeros(3, 2), torch.zeros(3))
    >>> prediction, draws, site = predict_with_draws(bnn, guide, torch.zeros(4, 2), num_samples=5)
    >>> draws["net.weight"].shape, site
    (torch.Size([5, 1, 2]), 'y')
    """
    x = cast_inputs(x, model_dtype(model))
    _check_predict_args(guide, x, num_samples, batch_size, sample_batch_size)
    if not is_set_up(guide):
        set_up_guide(model, guide, x[:1])
    # the joint predictive shares each weight draw across inputs, whatever training estimator is active around us
    if data_plate is None:
        data_plate = data_plate_of(model)
    with poutine.block(hide_types=["bayesian_affine"]), data_plate_named(data_plate):
        return _predict(model, guide, x, num_samples, batch_size, vectorize, sample_batch_size, data_plate)


def _predict(model, guide, x, num_samples, batch_size, vectorize, sample_batch_size, data_plate):
    chunks = list(x.split(batch_size)) if batch_size else [x]

    # One plain pass finds the observation site, the plate nesting and each latent site's own shape.
    plain_guide = poutine.trace(guide).get_trace(chunks[0])
    plain_pass = SubsampleCoverMessenger(data_plate, 0)(
        ObservationPlaceholderMessenger(data_plate, x.device)(poutine.replay(model, trace=plain_guide))
    )
    plain_model = poutine.trace(plain_pass).get_trace(chunks[0])
    obs = _observation_site(plain_model, plain_guide, data_plate)
    nesting = max((_site_plate_dims(site) for _, site in plain_model.iter_stochastic_nodes()), default=0)
    latent = {name: site for name, site in plain_guide.iter_stochastic_nodes()}
    local = [name for name, site in latent.items() if any(f.name == data_plate for f in site["cond_indep_stack"])]
    if local:
        raise ValueError(f"predict draws global weights only; the guide samples {local} inside the data plate.")

    with pyro.plate(SAMPLE_PLATE, num_samples, dim=-(nesting + 1)):
        guide_trace = poutine.trace(guide).get_trace(chunks[0])
    draws = {name: guide_trace.nodes[name]["value"] for name in latent}  # (S, 1, ..., *site shape)
    # draw 0 is the plain pass's draw (just as independent), so that the plain pass is also the lone run of draw 0
    # that checks the vectorized one
    draws = {name: torch.cat([plain_guide.nodes[name]["value"].reshape((1, *value.shape[1:])), value[1:]])
             for name, value in draws.items()}  # fmt: skip
    shapes = {name: site["value"].shape for name, site in latent.items()}
    alone = {k: v.unsqueeze(0) for k, v in _params(plain_model.nodes[obs]["fn"], plain_model.nodes[obs], 0)[2].items()}

    block = sample_batch_size or _draws_per_block(num_samples, chunks[0], shapes)
    results = None
    if vectorize is not False:
        try:
            results = [_run_covering(model, draws, shapes, chunk, obs, data_plate, nesting, block, num_samples)
                       for chunk in chunks]
            mismatch = _vectorized_mismatch(results[0], alone)
        except (RuntimeError, ValueError, IndexError) as error:
            results, mismatch = None, f"it could not run several weight draws in one call ({error})"
        if mismatch is not None:
            if vectorize:
                raise ValueError(f"predict(vectorize=True): {mismatch}.")
            results = None
            warnings.warn(
                f"predict: {mismatch}; falling back to one call per draw, which is slower but right. Inside "
                "pyro_bbb.BNN the network sees ordinary batches; a hand-written model's deterministic code must "
                "accept extra leading (draw) dimensions to be vectorized (e.g. index from the right: out[..., -1, :], "
                "nn.Flatten(start_dim=-3)).",
                stacklevel=6,  # the caller of predict (through predict_with_draws and torch.no_grad wrappers)
            )
    if results is None:
        results = [_run_covering(model, draws, shapes, chunk, obs, data_plate, nesting, None, num_samples)
                   for chunk in chunks]

    family, reinterpreted, _ = results[0]
    params = {name: torch.cat([p[name] for _, _, p in results], dim=1) for name in results[0][2]}
    distribution = _rebuild(family, reinterpreted, params)
    samples = distribution.sample()
    likelihood = getattr(model, "likelihood", None)
    if likelihood is not None and hasattr(likelihood, "prediction"):
        prediction = likelihood.prediction(distribution, samples)
    else:
        prediction = _prediction_for(distribution, samples)
    plain_draws = {name: value.reshape((num_samples, *shapes[name])) for name, value in draws.items()}
    return prediction, plain_draws, obs

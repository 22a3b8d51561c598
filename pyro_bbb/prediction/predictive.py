"""``predict``: the posterior predictive distribution from S weight draws, computed in one vectorized pass.

The predictive engine: the guide is drawn once, the model runs many draws per call inside a sample plate (inside
:class:`pyro_bbb.BNN` the network sees them folded into ordinary batches), draw 0 is checked against the same draw
run alone, and the per-draw likelihoods are stacked into a :mod:`pyro_bbb.prediction` result.

Examples
--------
>>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> guide = MeanFieldGuide(bnn)
>>> _ = guide(torch.randn(8, 3), torch.randn(8))   # normally done by pyro_bbb.fit
>>> pred = predict(bnn, guide, torch.randn(20, 3), num_samples=50)
>>> pred.mean.shape, pred.samples.shape
(torch.Size([20]), torch.Size([50, 20]))
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .._checks import check_count, is_set_up
from .._inputs import (
    Inputs,
    cast_inputs,
    check_finite_inputs,
    first_tensor,
    input_shapes,
    input_tensors,
    model_dtype,
    num_rows,
    select_rows,
    split_rows,
)
from .._internals import without_trace_shapes
from .._plates import data_plate_frame, data_plate_named, data_plate_of
from .._rng import rng_untouched
from .._warnings import warn_at_caller
from ..data.batches import loader_batches
from ..infer.guide import never_trained
from ..nn.module import training_mode
from .messengers import ObservationPlaceholderMessenger, SubsampleCoverMessenger
from .results import Prediction, prediction_for

__all__ = [
    "predict", "predict_with_draws", "set_up_guide", "UntrainedGuideWarning", "draws_per_block", "CPU_BLOCK_ELEMENTS",
]

SAMPLE_PLATE = "_predictive_samples"


# -- stacking per-draw likelihoods ------------------------------------------------------------------------------
_FAMILIES: dict[type, tuple[tuple[str, ...], Callable]] = {
    dist.Normal: (("loc", "scale"), lambda p: dist.Normal(p["loc"], p["scale"])),
    dist.Categorical: (("logits",), lambda p: dist.Categorical(logits=p["logits"])),
    dist.Bernoulli: (("logits",), lambda p: dist.Bernoulli(logits=p["logits"])),
}


def _family(fn: dist.Distribution) -> tuple[dist.Distribution, int]:
    """The observation's distribution under its ``.to_event`` wrappers, and how many batch dims they reinterpret."""
    reinterpreted = 0
    while isinstance(fn, dist.Independent):
        reinterpreted += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    return fn, reinterpreted


def _parameter_names(base: dist.Distribution) -> tuple[str, ...]:
    """The parameters that rebuild ``base``: a known family's, else (a likelihood of one's own: Poisson, StudentT,
    ...) those of its ``arg_constraints`` it was built with, if ``type(base)(**them)`` rebuilds it; a clear error
    otherwise."""
    for cls, (names, _) in _FAMILIES.items():
        if isinstance(base, cls):
            return names
    given = tuple(name for name in base.arg_constraints if _given(base, name))
    for names in (given, tuple(n for n in given if n != "logits"), tuple(n for n in given if n != "probs")):
        try:  # (probs and logits both known once one was read: the constructor takes one)
            rebuilt = type(base)(**{name: getattr(base, name) for name in names}, validate_args=False)
        except (TypeError, ValueError, NotImplementedError):
            continue
        if names and (rebuilt.batch_shape, rebuilt.event_shape) == (base.batch_shape, base.event_shape):
            return names
    raise ValueError(
        f"predict stacks the model's observation over the weight draws by its parameters, and cannot rebuild a "
        f"{type(base).__name__} from them ({', '.join(base.arg_constraints) or 'none declared'}): give the "
        "likelihood a distribution built from its arg_constraints (e.g. dist.Poisson(rate)), or one of "
        "pyro_bbb.likelihoods."
    )


def _given(base: dist.Distribution, name: str) -> bool:
    """Whether parameter ``name`` of ``base`` holds a tensor it was built with: set on the instance, or a property
    reading it (LogNormal's loc); not a lazy one it would compute from another (Binomial's logits from probs)."""
    if name in base.__dict__:
        return isinstance(base.__dict__[name], torch.Tensor)
    return isinstance(inspect.getattr_static(type(base), name, None), property) and isinstance(
        getattr(base, name), torch.Tensor)


def _params(fn: dist.Distribution, site: dict, draw_dims: int) -> tuple[type, int, dict[str, torch.Tensor]]:
    """The parameters of a site's ``fn``: ``draw_dims`` leading draw dims, then only the site's own plate dims.

    Under the sample plate the batch is ``(S, 1, ..., 1, *plates)``; the padding between goes.
    """
    base, reinterpreted = _family(fn)
    names = _parameter_names(base)
    batch = base.batch_shape
    keep = batch[:draw_dims] + batch[len(batch) - reinterpreted - _site_plate_dims(site) :]
    params = {}
    for name in names:
        value = getattr(base, name).expand(batch + getattr(base, name).shape[len(batch) :])
        params[name] = value.reshape(keep + value.shape[len(batch) :])
    return type(base), reinterpreted, params


def _rebuild(family: type, reinterpreted: int, params: dict[str, torch.Tensor]) -> dist.Distribution:
    known = next((build for cls, (_, build) in _FAMILIES.items() if issubclass(family, cls)), None)
    fn = known(params) if known is not None else family(**params)
    return fn.to_event(reinterpreted) if reinterpreted else fn


# -- the passes ------------------------------------------------------------------------------------------------
def _site_plate_dims(site: dict) -> int:
    dims = [-f.dim for f in site["cond_indep_stack"] if f.vectorized and f.name != SAMPLE_PLATE]
    return max(dims, default=0)


def _nested_plate_dims(site: dict, data_plate: str) -> int:
    """The batch dims right of the data plate's, when an observation site has a plate there
    (``pyro.plate("outputs", 3, dim=-1)`` in ``pyro.plate("data", N, dim=-2)``): one row's outputs, scored together
    as ``.to_event`` would score them (the same weight draw for all of them), not as rows of their own; 0 without
    such a plate (a trailing dimension of size 1 stays as it is). A plate at a dim left of the data plate's is
    refused: it would put the rows on another dimension."""
    frame = data_plate_frame(site, data_plate)
    if frame is None or frame.dim is None:
        return 0
    others = [f for f in site["cond_indep_stack"] if f.vectorized and f.name not in (SAMPLE_PLATE, data_plate)]
    outer = [f"{f.name!r} (dim {f.dim})" for f in others if f.dim < frame.dim]
    if outer:
        raise ValueError(
            f"the observation {site['name']!r} has plate {', '.join(outer)} at a dim left of its data plate "
            f"{data_plate!r}'s (dim {frame.dim}), so its rows are not its first dimension: give the data plate the "
            f"outermost dim (pyro.plate({data_plate!r}, N, dim=-2) around pyro.plate(..., dim=-1); Pyro numbers "
            "plates without dim= from the right, the outermost last) or give the outputs one distribution with "
            ".to_event(1)."
        )
    return -frame.dim - 1 if any(f.dim > frame.dim for f in others) else 0


def _observation_site(model_trace, guide_trace, data_plate: str, caller: str = "predict") -> str:
    names = [
        name
        for name, site in model_trace.iter_stochastic_nodes()
        if name not in guide_trace.nodes and data_plate_frame(site, data_plate) is not None
        and not site_is_subsample(site)  # a plate nested in the data plate (its index site)
    ]
    if len(names) != 1:
        raise ValueError(
            f"{caller} needs exactly one observation site inside pyro.plate({data_plate!r}) that the guide does not "
            f"sample; the model has {names or 'none'}. Build the model as pyro_bbb.BNN(net, likelihood), or name "
            f"your data plate: {caller}(..., data_plate='its name')."
        )
    return names[0]


#: On a CPU, weight draws are run in blocks whose activations hold about this many numbers (8 MB of float32):
#: beyond the cache, one huge batched product is slower than several smaller ones (benchmarks/predict.py).
CPU_BLOCK_ELEMENTS = 2**21


def _positions(tensor: torch.Tensor) -> int:
    """Positions per input: an integer sequence's tokens, an image's pixels (``x[0].numel() / channels``), else 1."""
    if not tensor.is_floating_point() and tensor.dim() >= 2:
        return tensor[0].numel()
    return tensor[0].numel() // tensor.shape[1] if tensor.dim() > 2 else 1


def draws_per_block(num_samples: int, x: Inputs, shapes: dict[str, torch.Size]) -> int:
    """How many weight draws to run together: all of them on an accelerator; cache-sized blocks on a CPU.

    The activations per input and draw are estimated from the weights: a linear layer's output features (times the
    tokens of an integer sequence input), a convolution's output channels times the input's positions
    (``x[0].numel() / channels``).

    Examples
    --------
    >>> draws_per_block(100, torch.zeros(500, 32), {"fc.weight": torch.Size([256, 32])})
    16
    """
    if first_tensor(x).device.type != "cpu":
        return num_samples
    tensors = input_tensors(x).values()
    positions = max(_positions(t) for t in tensors)
    tokens = max((_positions(t) for t in tensors if not t.is_floating_point()), default=1)
    width = sum(shape[0] * (positions if len(shape) > 2 else tokens) for shape in shapes.values() if len(shape) >= 2)
    return max(1, min(num_samples, CPU_BLOCK_ELEMENTS // (num_rows(x) * (width or 1))))


def _run_draws(model, draws, shapes, x, obs, data_plate: str, nesting: int, block: int | None, num_samples: int):
    """The observation's parameters under every draw: ``block`` draws per call inside a sample plate, or one call
    per draw without any plate (``block=None``, the fallback for models that cannot be vectorized)."""
    parts = []
    for start in range(0, num_samples, block or 1):
        stop = min(start + (block or 1), num_samples)
        placeholder = ObservationPlaceholderMessenger(data_plate, first_tensor(x).device)
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


def _run_covering(model, draws, shapes, x, obs, data_plate: str, nesting: int, block, num_samples: int):
    """:func:`_run_draws` over every input: a data plate that subsamples is run piece by piece (its full size
    covered once, in order) and the pieces joined."""
    parts, piece = [], 0
    while True:
        cover = SubsampleCoverMessenger(data_plate, piece)
        family, reinterpreted, params = _run_draws(cover(model), draws, shapes, x, obs, data_plate, nesting, block,
                                                   num_samples)
        if cover.size is None:
            return family, reinterpreted, params
        keep = min(cover.subsample_size, cover.size - piece * cover.subsample_size)
        parts.append({name: value[:, :keep] for name, value in params.items()})
        piece += 1
        if piece * cover.subsample_size >= cover.size:
            return family, reinterpreted, {name: torch.cat([p[name] for p in parts], 1) for name in parts[0]}


def _vectorized_mismatch(result, alone: dict[str, torch.Tensor], draw: int = 0) -> str | None:
    """Draw ``draw`` of a vectorized pass against the same draw run alone (``alone``: the observation's parameters
    of that run, e.g. the plain pass's for draw 0): a model whose code reads the draw dimensions as its batch, or
    mixes rows (and so the draws folded into them), gives other numbers, and is then run one draw at a time rather
    than trusted."""
    _, _, vectorized = result
    for name, value in alone.items():
        first = vectorized[name][draw:draw + 1]
        first = first[:, : value.shape[1]] if value.dim() > 1 else first  # piece 0
        if value.shape[1:] != first.shape[1:]:
            return (f"the vectorized draws gave the observation's {name!r} shape {tuple(vectorized[name].shape[1:])} "
                    f"per draw, one draw alone {tuple(value.shape[1:])}")
        if not torch.allclose(first, value, rtol=1e-4, atol=1e-5):
            return f"the vectorized draws gave other values of the observation's {name!r} than one draw alone"
    return None


class UntrainedGuideWarning(UserWarning):
    """``predict`` (or ``to_inference_data``) was given a guide that was never trained (it has not seen the model, or
    it is a :class:`~pyro_bbb.MeanFieldGuide` no step has changed): its predictions are those of the initial
    posterior.

    Examples
    --------
    >>> issubclass(UntrainedGuideWarning, UserWarning)
    True
    """


def set_up_guide(model: Callable, guide: Callable, x: Inputs) -> None:
    """Set up an autoguide that has not seen the model yet (e.g. a converted or MOPED-initialised model before any
    VI) from inputs alone: the observation is given a placeholder value drawn from the model (so that Pyro does not
    take it for a latent variable), and the user's random stream is left where it was.

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(3, 2), likelihoods.Categorical())
    >>> guide = MeanFieldGuide(bnn)
    >>> set_up_guide(bnn, guide, torch.randn(1, 3))
    >>> sorted(name for name, _ in guide.prototype_trace.iter_stochastic_nodes())
    ['net.bias', 'net.weight']
    """
    data_plate = data_plate_of(model)
    with without_trace_shapes(), rng_untouched(), torch.no_grad(), poutine.block():
        trace = poutine.trace(model).get_trace(x)
        observations = [site["value"] for site in trace.nodes.values()
                        if site["type"] == "sample" and data_plate_frame(site, data_plate) is not None
                        and not site_is_subsample(site)]  # (a plate nested in the data plate: its index site)
        guide(x, *observations[:1])


def _check_predict_args(guide, x, num_samples, batch_size, sample_batch_size) -> None:
    check_count("num_samples", num_samples)
    check_count("batch_size", batch_size, optional=True)
    check_count("sample_batch_size", sample_batch_size, optional=True)
    if num_rows(x) == 0:
        raise ValueError(f"x must hold at least one input along its first dimension, got {input_shapes(x)}.")
    check_finite_inputs(x, "x holds values whose predictions would be NaN")


@torch.no_grad()
def predict(
    model: Callable,
    guide: Callable,
    x: Inputs,
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
    samples are drawn last, from the stacked likelihoods. The model runs in evaluation mode (dropout off, batch norm
    on its running statistics: the weight draws carry the uncertainty), and gets its own mode back after.

    Parameters
    ----------
    model : callable
        Called as ``model(x)``; it must sample its observation inside ``pyro.plate(data_plate)``, e.g. a
        :class:`pyro_bbb.BNN`.
    guide : callable
        A fitted guide such as :class:`pyro_bbb.MeanFieldGuide`.
    x : Tensor, tuple of Tensor, dict of Tensor or DataLoader
        Inputs, first dimension the batch (a tuple or dict: every tensor's first dimension; e.g. a transformers
        ``BatchEncoding``); or a DataLoader that does not shuffle, yielding ``(x, y)`` pairs as ``fit`` takes them
        (``y`` unread) or inputs alone: one prediction per row in its order, its batches run one at a time (each
        its own padding), split further by ``batch_size`` if given.
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

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(4, 3), likelihoods.Categorical())
    >>> guide = MeanFieldGuide(bnn)
    >>> _ = guide(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    >>> predict(bnn, guide, torch.randn(10, 4), num_samples=20, batch_size=4).probs.shape
    torch.Size([10, 3])
    """
    return predict_with_draws(model, guide, x, num_samples, batch_size, vectorize, sample_batch_size, data_plate)[0]


@torch.no_grad()
def predict_with_draws(
    model, guide, x, num_samples=100, batch_size=None, vectorize=None, sample_batch_size=None, data_plate=None, *,
    caller: str = "predict",
) -> tuple[Prediction, dict[str, torch.Tensor], str]:
    """:func:`predict`, also returning the weight draws it used (``{site: (S, *site shape)}``) and the name of
    the observation site -- so that an export can show the very draws behind the predictive. ``caller`` names the
    function the user called in predict's warnings and errors.

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.1))
    >>> guide = MeanFieldGuide(bnn)
    >>> _ = guide(torch.zeros(3, 2), torch.zeros(3))
    >>> prediction, draws, site = predict_with_draws(bnn, guide, torch.zeros(4, 2), num_samples=5)
    >>> draws["net.weight"].shape, site
    (torch.Size([5, 1, 2]), 'y')
    """
    # the chunks of inputs the model runs on (the same draws for all): a DataLoader's batches, or x's
    parts = loader_batches(x, caller) if isinstance(x, torch.utils.data.DataLoader) else [x]
    parts = [cast_inputs(part, model_dtype(model)) for part in parts]
    for part in parts:
        _check_predict_args(guide, part, num_samples, batch_size, sample_batch_size)
    chunks = [chunk for part in parts for chunk in (split_rows(part, batch_size) if batch_size else [part])]
    set_up = is_set_up(guide)
    if not set_up or never_trained(guide):
        warn_at_caller(
            f"{caller}: the guide was never trained{'' if set_up else ' (it has not seen the model yet)'}, so these "
            f"are the predictions of its initial posterior ({type(guide).__name__}'s starting means and widths), not "
            "of a fitted one. Train it first (pyro_bbb.fit), unless the initial posterior is what you want (e.g. "
            "bayesianize of trained weights).",
            UntrainedGuideWarning,
        )
    if not set_up:  # (in evaluation mode: batch norm reads its running statistics, does not update them)
        with training_mode(model, False):
            # one row is enough to make the guide's parameters; a 1-d input may be one unbatched row (whose error,
            # from the full run, says to pass x[None]) or a batch of scalars: all of it, then
            one_d = first_tensor(chunks[0]).dim() < 2
            set_up_guide(model, guide, chunks[0] if one_d else select_rows(chunks[0], slice(0, 1)))
    # the joint predictive shares each weight draw across inputs, whatever training estimator is active around us
    if data_plate is None:
        data_plate = data_plate_of(model)
    with (without_trace_shapes(), poutine.block(hide_types=["bayesian_affine"]), data_plate_named(data_plate),
          training_mode(model, False)):
        return _predict(model, guide, chunks, num_samples, vectorize, sample_batch_size, data_plate, caller)


def _predict(model, guide, chunks, num_samples, vectorize, sample_batch_size, data_plate, caller):
    # One plain pass finds the observation site, the plate nesting and each latent site's own shape.
    plain_guide = poutine.trace(guide).get_trace(chunks[0])
    cover = SubsampleCoverMessenger(data_plate, 0)
    placeholder = ObservationPlaceholderMessenger(data_plate, first_tensor(chunks[0]).device)
    plain_pass = cover(placeholder(poutine.replay(model, trace=plain_guide)))
    plain_model = poutine.trace(plain_pass).get_trace(chunks[0])
    obs = _observation_site(plain_model, plain_guide, data_plate, caller)
    nested = _nested_plate_dims(plain_model.nodes[obs], data_plate)  # (a row's outputs in plates of their own)
    nesting = max((_site_plate_dims(site) for _, site in plain_model.iter_stochastic_nodes()), default=0)
    # a latent site the model observes itself (poutine.condition on a weight) is data: its value, not the guide's draws
    latent = {name: site for name, site in plain_guide.iter_stochastic_nodes()
              if not (name in plain_model.nodes and plain_model.nodes[name]["is_observed"])}
    local = [name for name, site in latent.items() if data_plate_frame(site, data_plate) is not None]
    if local:
        raise ValueError(f"predict draws global weights only; the guide samples {local} inside the data plate.")

    with pyro.plate(SAMPLE_PLATE, num_samples, dim=-(nesting + 1)):
        guide_trace = poutine.trace(guide).get_trace(chunks[0])
    shapes = {name: site["value"].shape for name, site in latent.items()}
    # draw 0 is the plain pass's draw (just as independent), so that the plain pass is also the lone run of draw 0
    # that checks the vectorized one. Each draw is (S, 1, *site shape) whatever the plates nested in the data plate:
    # a layer applies (S, 1, out, in) to a (B, in) batch as (S, B, out), the draw dim landing at -3 under a plate at
    # dim -1 inside the data plate
    draws = {name: torch.cat([site["value"].reshape((1, 1, *shapes[name])),
                              guide_trace.nodes[name]["value"][1:].reshape((num_samples - 1, 1, *shapes[name]))])
             for name, site in latent.items()}
    alone = {k: v.unsqueeze(0) for k, v in _params(plain_model.nodes[obs]["fn"], plain_model.nodes[obs], 0)[2].items()}
    if cover.size is not None:  # piece 0 of a subsampling plate: only its first min(m, n) entries are distinct data
        alone = {k: v[:, : min(cover.size, cover.subsample_size)] for k, v in alone.items()}

    block = sample_batch_size or draws_per_block(num_samples, chunks[0], shapes)
    results = None
    if vectorize is not False:
        try:
            results = [_run_covering(model, draws, shapes, chunk, obs, data_plate, nesting, block, num_samples)
                       for chunk in chunks]
            mismatch = _vectorized_mismatch(results[0], alone)
            last = min(block, num_samples) - 1  # the first block's last draw: rows mixed with earlier rows show there
            if mismatch is None and last > 0:
                one = {name: value[last:last + 1] for name, value in draws.items()}
                lone = _run_covering(model, one, shapes, chunks[0], obs, data_plate, nesting, None, 1)[2]
                mismatch = _vectorized_mismatch(results[0], lone, draw=last)
        except (RuntimeError, ValueError, IndexError) as error:
            reason = re.split(r"\n\s*Trace Shapes:", str(error))[0].strip()  # (without Pyro's shape table)
            results, mismatch = None, f"it could not run several weight draws in one call ({reason})"
        if mismatch is not None:
            if vectorize:
                raise ValueError(f"{caller}(vectorize=True): {mismatch}.")
            results = None
            warn_at_caller(
                f"{caller}: {mismatch}; falling back to one call per draw, which is slower but right. Inside "
                "pyro_bbb.BNN the network sees ordinary batches and pyro_bbb's layers apply every draw at once, but "
                "a layer whose weights are PyroSample sites of its own (PyroModule[nn.Linear]) gets them with extra "
                "leading (draw) dimensions: use pyro_bbb.nn's layers (bayesianize the deterministic net). A "
                "hand-written model's deterministic code must accept such dimensions to be vectorized (e.g. index "
                "from the right: out[..., -1, :], nn.Flatten(start_dim=-3)). A net whose rows depend on other rows "
                "(h - h[:1], a cumsum or statistics over the batch) mixes the draws folded into its batch: run each "
                "draw alone (vectorize=False) to say so and silence this.",
            )
    if results is None:
        results = [_run_covering(model, draws, shapes, chunk, obs, data_plate, nesting, None, num_samples)
                   for chunk in chunks]

    family, reinterpreted, _ = results[0]
    reinterpreted += nested
    past_rows = {name: sorted({tuple(p[name].shape[2:]) for _, _, p in results}) for name in results[0][2]}
    if any(len(shapes) > 1 for shapes in past_rows.values()):
        raise ValueError(
            f"{caller}: the chunks' outputs differ in shape past the batch dimension "
            f"({max(past_rows.values(), key=len)}): an output per position of inputs padded to each batch's own "
            "length. Pad every batch to one length (a collate_fn with a fixed length), or predict each batch on its "
            "own."
        )
    params = {name: torch.cat([p[name] for _, _, p in results], dim=1) for name in results[0][2]}
    distribution = _rebuild(family, reinterpreted, params)
    samples = distribution.sample()
    likelihood = getattr(model, "likelihood", None)
    if likelihood is not None and hasattr(likelihood, "prediction"):
        prediction = likelihood.prediction(distribution, samples)
    else:
        prediction = prediction_for(distribution, samples)
    # the model's latent sites (an autoguide's auxiliary sites -- AutoNormal's unconstrained values, the joint latent
    # of AutoDiagonalNormal -- are the guide's own, not the model's: left out of what is reported)
    plain_draws = {name: value.reshape((num_samples, *shapes[name])) for name, value in draws.items()
                   if not latent[name]["infer"].get("is_auxiliary")}
    return prediction, plain_draws, obs

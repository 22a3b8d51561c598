"""``to_inference_data``: the posterior, the predictive and the pointwise log-likelihood, for ArviZ.

Everything ArviZ-specific lives here. The groups are built as :class:`xarray.Dataset` objects and wrapped for the
installed ArviZ: an ``az.InferenceData`` for ArviZ 0.x (``arviz`` 0.23 on Python 3.11), an ``xarray.DataTree``
for ArviZ 1.x (``arviz`` >= 1, or ``arviz-base`` / ``arviz-stats`` beside 0.x: ask with
``container="DataTree"``). Both carry the same groups, variables and dimensions, so ``az.loo`` on the one and
``arviz_stats.loo`` on the other give the same numbers.

Examples
--------
>>> x, y = torch.randn(30, 2), torch.randn(30)
>>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> _ = pyro_bbb.fit(bnn, guide, (x, y), epochs=2, progress=False)
>>> idata = to_inference_data(bnn, guide, x, y, num_samples=100)
>>> idata.posterior["net.weight"].dims
('chain', 'draw', 'net_out', 'net_in')
>>> idata.log_likelihood["y"].shape
(1, 100, 30)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
import torch
import xarray as xr

from .._checks import check_count
from .._inputs import Inputs, cast_inputs, input_tensors, model_dtype, num_rows, targets_of_shape
from .._warnings import warn_at_caller
from ..data.provenance import fraction_seen_in_training
from ..infer.tempering import kl_weight_of
from ..nn.module import site_owners
from ..prediction.predictive import predict_with_draws

__all__ = ["to_inference_data", "LARGE_POSTERIOR_BYTES", "CONTAINERS"]

#: A posterior group larger than this (in bytes) triggers a warning with its size and the ``sites=`` fix.
LARGE_POSTERIOR_BYTES = 200 * 2**20


def _clean(name: str) -> str:
    return re.sub(r"\W", "_", name) or "root"


def _site_dims(model: Callable, shapes: dict[str, torch.Size]) -> dict[str, list[str]]:
    """Readable dimension names: ``fc1.weight`` -> ``fc1_out, fc1_in`` (convolutions add ``fc1_k0, ...``; a
    transposed convolution's weight is ``fc1_in, fc1_out, ...``). A layer whose weights disagree on a size (a
    recurrent layer's input-to-hidden and hidden-to-hidden weights) names them per site instead:
    ``rnn_weight_ih_l0_out, rnn_weight_ih_l0_in``."""
    owners = site_owners(model)
    layers = {site: "layer" if owner == "(root)" else _clean(owner) for site, owner in owners.items()}
    modules = dict(model.named_modules()) if isinstance(model, torch.nn.Module) else {}
    transposed = {site for site, owner in owners.items()  # (in, out, *kernel): torch's ConvTranspose and ours
                  if getattr(modules.get("" if owner == "(root)" else owner), "transposed", False)}

    def named(prefix: str, shape: torch.Size, site: str) -> list[str]:
        channels = [f"{prefix}_in", f"{prefix}_out"] if site in transposed else [f"{prefix}_out", f"{prefix}_in"]
        if len(shape) == 1:  # (a bias: one per output)
            channels = [f"{prefix}_out"]
        return (channels + [f"{prefix}_k{i}" for i in range(len(shape) - 2)])[: len(shape)]

    sizes: dict[str, int] = {}
    disagreeing = set()
    for site, shape in shapes.items():
        layer = layers.get(site)
        if layer is not None and len(shape) >= 1:
            for name, size in zip(named(layer, shape, site), shape):
                if sizes.setdefault(name, size) != size:
                    disagreeing.add(layer)
    dims = {}
    for site, shape in shapes.items():
        layer = layers.get(site)
        if layer is not None and len(shape) >= 1:
            dims[site] = named(_clean(site) if layer in disagreeing else layer, shape, site)
        else:
            dims[site] = [f"{_clean(site)}_{i}" for i in range(len(shape))]
    return dims


def _by_chain(value: torch.Tensor, num_chains: int) -> np.ndarray:
    array = value.detach().cpu().numpy()
    return array.reshape((num_chains, array.shape[0] // num_chains) + array.shape[1:])


def _input_variables(x: Inputs) -> dict[str, tuple[list[str], np.ndarray]]:
    """``constant_data``'s variables: ``x`` for one tensor; ``x_0``, ``x_1`` or ``x_<key>`` for a tuple or dict."""
    variables = {}
    for label, tensor in input_tensors(x).items():
        name = "x" if label == "x" else _clean(label.replace("'", "").replace("[", "_").rstrip("]"))
        dims = ["obs_id"] + [f"{name}_{i}" for i in range(tensor.dim() - 1)]
        variables[name] = (dims, tensor.detach().cpu().numpy())
    return variables


#: The containers :func:`to_inference_data` can return (``container=``): ``"auto"`` picks ``"InferenceData"``
#: under ArviZ 0.x and ``"DataTree"`` under ArviZ 1.x (or without the ``arviz`` package).
CONTAINERS = ("auto", "InferenceData", "DataTree")


def _arviz_major() -> int | None:
    try:
        import arviz as az
    except ImportError:
        return None
    return int(az.__version__.split(".")[0])


def _wrap(groups: dict[str, xr.Dataset], container: str):
    """``az.InferenceData`` or an ``xarray.DataTree`` (what ArviZ 1.x works with) holding ``groups``."""
    if container == "auto":
        major = _arviz_major()
        container = "InferenceData" if major is not None and major < 1 else "DataTree"
    if container == "DataTree":
        return xr.DataTree.from_dict({f"/{name}": dataset for name, dataset in groups.items()})
    major = _arviz_major()
    if major is None or major >= 1:
        raise ValueError(
            'container="InferenceData" needs ArviZ 0.x (pip install "arviz<1"); '
            + ("ArviZ is not installed" if major is None else "ArviZ 1.x works with xarray.DataTree")
            + ': use container="DataTree".'
        )
    import arviz as az

    return az.InferenceData(**groups)


def _warn_loo_of_a_tempered_posterior(kl_weight: float, seen: float | None) -> None:
    """PSIS-LOO and WAIC read a row's pull on the posterior from its log-likelihood, which a tempered posterior counts
    1/kl_weight times: said unless the rows are known to be held out (``seen``: the fraction of them trained on)."""
    if seen == 0.0:  # held-out rows: scored as they are, no leave-one-out asked of them
        return
    direction = ("overstate its elpd (and az.compare favours it over the Bayes posterior)" if kl_weight < 1
                 else "understate its elpd")
    warn_at_caller(
        f"to_inference_data: this posterior is tempered (KL weight {kl_weight:g}): it counts every training row "
        f"1/{kl_weight:g} times, and az.loo / az.waic on its log_likelihood take a row out as if it counted once, so "
        f"they {direction}. Compare posteriors on held-out rows instead (pyro_bbb.evaluate.metrics.log_likelihood "
        "of predict); the export itself is right, for held-out scoring and plots."
    )


def to_inference_data(
    model: Callable,
    guide: Callable,
    x: Inputs,
    y: torch.Tensor | None = None,
    num_samples: int = 500,
    sites: Sequence[str] | None = None,
    num_chains: int = 1,
    *,
    batch_size: int | None = None,
    container: str = "auto",
    data_plate: str | None = None,
):
    """Export one set of posterior draws, and everything computed from them, to ArviZ.

    The guide is drawn once (``num_chains * num_samples`` draws, split into ``num_chains`` "chains": VI draws are
    independent, so chains carry no convergence information) and the same draws give every group:

    * ``posterior``: the weight sites (``sites``, default all), dims named after the layer (``fc1_out``,
      ``fc1_in``);
    * ``posterior_predictive``: one predictive draw of the targets per weight draw;
    * ``log_likelihood`` (with ``y``): ``log p(y_i | x_i, w_s)`` per datum, unscaled, for ``az.loo`` / ``az.waic``
      (a net with several outputs per row: their sum, so LOO leaves out whole rows; ``az.plot_loo_pit`` needs one
      value per output and so works on one-output models only). Of a tempered posterior (KL weight ``w``, which
      counts each training row ``1/w`` times) PSIS-LOO and WAIC misstate the elpd (overstate it for ``w < 1``): a
      warning says so unless the rows are known to be held out; compare such posteriors on held-out rows;
    * the ``posterior`` group's attributes ``kl_weight``, ``kl_weight_chosen_by``, ``tempered_posterior`` and
      ``kl_weight_note`` when the guide was trained by :func:`pyro_bbb.fit` (see :mod:`pyro_bbb.infer.tempering`):
      a posterior trained at a KL weight other than 1 is a tempered one, not the Bayes posterior;
    * ``observed_data`` (with ``y``) and ``constant_data`` (``x``; a tuple or dict of inputs gives one variable per
      tensor: ``x_0``, ``x_1`` or ``x_input_ids``, ``x_attention_mask``); the data dimension is ``obs_id``.

    Parameters
    ----------
    model, guide :
        A model with its observation in the data plate (e.g. :class:`pyro_bbb.BNN`) and a fitted guide.
    x, y : Tensor
        Inputs (a tensor, or a tuple or dict of tensors), and optionally the observed targets.
    num_samples : int
        Draws per chain.
    sites : sequence of str, optional
        Latent sites for the ``posterior`` group. A posterior larger than :data:`LARGE_POSTERIOR_BYTES` warns.
    num_chains : int
        Number of chains to split the draws into.
    batch_size : int, optional
        Inputs per model call (as in :func:`pyro_bbb.predict`).
    container : {"auto", "InferenceData", "DataTree"}
        What to return (see :data:`CONTAINERS`): by default what the installed ArviZ works with.
    data_plate : str, optional
        A hand-written model's data plate (as in :func:`pyro_bbb.predict`): by default the model's ``data_plate``
        attribute, else ``"data"``.

    Returns
    -------
    arviz.InferenceData (ArviZ 0.x) or xarray.DataTree (ArviZ 1.x)

    Examples
    --------
    See the module example; then ``az.loo(idata, reff=1.0)`` and ``az.plot_ppc(idata)``. For ArviZ 1.x
    (``arviz-base`` and ``arviz-stats``):

    >>> x, y = torch.randn(30, 2), torch.randn(30)
    >>> bnn = pyro_bbb.BNN(BayesianLinear(2, 1), likelihoods.Gaussian(scale=0.5))
    >>> guide = pyro_bbb.MeanFieldGuide(bnn)
    >>> _ = guide(x, y)
    >>> tree = to_inference_data(bnn, guide, x, y, num_samples=100, container="DataTree")
    >>> sorted(tree.children)
    ['constant_data', 'log_likelihood', 'observed_data', 'posterior', 'posterior_predictive']
    >>> tree["log_likelihood"]["y"].dims
    ('chain', 'draw', 'obs_id')
    """
    if container not in CONTAINERS:
        raise ValueError(f"container must be one of {CONTAINERS}, got {container!r}.")
    check_count("num_chains", num_chains)
    x = cast_inputs(x, model_dtype(model))
    if y is not None and len(y) != num_rows(x):  # (before any draw from the caller's random stream)
        raise ValueError(f"x has {num_rows(x)} rows but y has {len(y)}: one target per row.")
    prediction, draws, obs = predict_with_draws(model, guide, x, num_samples * num_chains, batch_size,
                                                data_plate=data_plate, caller="to_inference_data")
    if sites is None:
        sites = list(draws)
    unknown = [s for s in sites if s not in draws]
    if unknown:
        raise ValueError(f"no latent sites named {unknown}; the guide's sites are {sorted(draws)}.")
    size = sum(draws[s].numel() * draws[s].element_size() for s in sites)
    if size > LARGE_POSTERIOR_BYTES:
        warn_at_caller(
            f"the posterior group holds {size / 2**20:.0f} MB ({num_samples * num_chains} draws of "
            f"{len(sites)} sites); pass sites=[...] to export fewer layers, or fewer num_samples.",
        )
    shapes = {s: draws[s].shape[1:] for s in sites}
    dims = _site_dims(model, shapes)
    chain_draw = ["chain", "draw"]
    coords = {"chain": np.arange(num_chains), "draw": np.arange(num_samples), "obs_id": np.arange(num_rows(x))}

    def dataset(variables: dict[str, tuple[list[str], np.ndarray]]) -> xr.Dataset:
        used = {d for dims_, _ in variables.values() for d in dims_}
        return xr.Dataset(variables, coords={k: v for k, v in coords.items() if k in used})

    event_dims = [f"{obs}_{i}" for i in range(prediction.samples.dim() - 2)]
    groups = {
        "posterior": dataset({s: (chain_draw + dims[s], _by_chain(draws[s], num_chains)) for s in sites}),
        "posterior_predictive": dataset(
            {obs: (chain_draw + ["obs_id"] + event_dims, _by_chain(prediction.samples, num_chains))}
        ),
        "constant_data": dataset(_input_variables(x)),
    }
    if y is not None:
        y = targets_of_shape(y, prediction.samples.shape[1:]).to(prediction.samples.device)
        likelihood = getattr(model, "likelihood", None)
        if likelihood is not None and hasattr(likelihood, "check_targets"):
            y = likelihood.check_targets(y)
        log_lik = prediction.log_prob(y)
        if log_lik.dim() > 2:  # plates nested in the data plate (multi-output): one pointwise value per datum
            log_lik = log_lik.flatten(2).sum(-1)
        groups["log_likelihood"] = dataset({obs: (chain_draw + ["obs_id"], _by_chain(log_lik, num_chains))})
        groups["observed_data"] = dataset({obs: (["obs_id"] + event_dims, y.detach().cpu().numpy())})
    choice = kl_weight_of(guide)
    if y is not None and choice is not None and choice.tempered and not choice.point_estimate:
        _warn_loo_of_a_tempered_posterior(choice.kl_weight, fraction_seen_in_training(guide, x))
    if choice is not None:  # a tempered posterior says so in the posterior's own attributes
        groups["posterior"].attrs.update({"kl_weight": choice.kl_weight, "kl_weight_chosen_by": choice.chosen_by,
                                          "tempered_posterior": int(choice.tempered),
                                          "kl_weight_note": choice.describe()})
    return _wrap(groups, container)

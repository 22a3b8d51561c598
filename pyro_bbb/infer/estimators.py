"""Lower-variance gradient estimators as Pyro effect handlers: Flipout, local reparameterization and moment
propagation (deterministic variational inference).

Bayes-by-Backprop draws one weight matrix per minibatch, so every example of the batch sees the same weights and
the gradient noise does not shrink with the batch size. Both handlers decorrelate the examples without changing
the objective's expectation. Every Bayesian layer runs its linear map through the effectful operation
:func:`pyro_bbb.nn.functional.bayesian_affine`; a handler intercepts it, reads the posterior mean and scale that
:class:`pyro_bbb.MeanFieldGuide` attached to the weight's site, and computes the layer's output its own way.
Outside a handler the layers are unchanged, and the KL term is never touched. A weight a Pyro-style model samples
with ``PyroSample`` and passes to torch's ``F.linear`` or a convolution (``PyroModule[nn.Linear]``) is met there
instead, by identity with the guide's draw; a weight used otherwise is a clear error, never a silent no-op.

Examples
--------
>>> bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.1))
>>> guide = pyro_bbb.MeanFieldGuide(bnn)
>>> svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 1e-2}), pyro_bbb.ELBO(num_data=100))
>>> with pyro_bbb.flipout():
...     loss = svi.step(torch.randn(10, 3), torch.randn(10))
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from contextlib import ExitStack, nullcontext
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from pyro.poutine.messenger import Messenger
from torch.overrides import TorchFunctionMode

from .._draws import example_draw_shape, known_batch_rows
from .._internals import BatchNormNd, active_messengers, wrap_in
from .._warnings import warn_at_caller
from ..nn.functional import FlipoutMap, batched_conv, batched_linear, sample_dims
from ..nn.module import is_layer_prior
from ..nn.moments import MomentPropagationError, affine_moments, tracking_modules
from .guide import drawn_posterior

__all__ = [
    "FlipoutMessenger", "LocalReparameterizationMessenger", "flipout", "local_reparameterization",
    "MomentPropagationMessenger", "moment_propagation", "ESTIMATORS",
    "estimator", "PosteriorReader", "started_estimators", "check_estimators_reached",
]


class PosteriorReader(Messenger):
    """Remembers the ``(loc, scale)`` that :class:`~pyro_bbb.MeanFieldGuide` attaches to each site it samples."""

    estimator = ""
    draws_per_row = True  # its draws go one per example (the rows of a layer's input): checked against the batch
    #: what it does with each output element, and why that is wrong for outputs that share one weight draw: set
    #: where it cannot be exact for a layer whose rows hold several positions of one example (:meth:`check_positions`)
    positions_refusal: tuple[str, str] | None = None

    def __init__(self):
        super().__init__()
        self._posteriors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._used: set[str] = set()  # the weight sites a layer operation read this model run
        self._drawn: dict[int, tuple[Callable, str]] = {}  # id of a guide's draw -> (weak ref to it, its site)
        self._met: set[int] = set()  # the draws a torch function brought to this estimator since the model sampled them
        self._layer_draws: dict[int, Callable] = {}  # id -> weak ref of each draw a pyro_bbb layer brought this run
        self._rows_per_site: dict[str, int] = {}  # weight site -> rows it drew per row of, the batch's being unknown
        self._interceptor: _DrawnWeightLinear | None = None  # on once a model samples a weight outside our layers
        self._outside: set[str] = set()  # the weight sites whose draw was read outside its layer's call this run
        self._warned_outside: set[str] = set()  # (said once per site)
        self._model_only = False  # wrapping the model alone (handler(model)): every draw it meets is the model's
        self._perturbed: list = []  # the autograd nodes of this run's per-row perturbed layer outputs
        self._batch_norm_hook = None  # (the global pre-hook of _refuse_batch_norm, while the handler is entered)

    def __call__(self, fn: Callable) -> Callable:
        """``handler(model)``: the model run inside the handler, as a run of its own (the guide runs outside it, so
        the objective sees no handler around both): its draws told apart as the model's, the checks of a run at its
        end."""
        if not callable(fn):
            return super().__call__(fn)  # (Pyro's error)
        return wrap_in(self, _run_model_inside, fn)

    def __enter__(self):
        entered = super().__enter__()
        # a batch norm on batch statistics of a perturbed layer's output couples the rows: refused as it runs (a
        # global pre-hook, there while the handler is; in evaluation mode, or on what no such layer feeds, it is exact)
        self._batch_norm_hook = (torch.nn.modules.module.register_module_forward_pre_hook(self._refuse_batch_norm)
                                 if self.draws_per_row else None)
        return entered

    def __exit__(self, *exc):
        if self._interceptor is not None:
            self._interceptor.__exit__(*exc)
            self._interceptor = None
        if self._batch_norm_hook is not None:
            self._batch_norm_hook.remove()
            self._batch_norm_hook = None
        return super().__exit__(*exc)

    def _refuse_batch_norm(self, module: torch.nn.Module, args: tuple) -> None:
        """A clear error, before the loss, for a batch norm on the batch's statistics of what a layer this estimator
        perturbed per row in this run feeds (found in the input's autograd graph): its per-row draws, which give each
        row's output the right distribution, do not give the batch's statistics, that mix the rows, the distribution
        one shared weight draw gives (the ELBO changes: 17.5 against 23.0 on a 1-1 net)."""
        if not (self._perturbed and isinstance(module, BatchNormNd) and (
                module.training or not module.track_running_stats)):
            return
        node = getattr(args[0], "grad_fn", None) if args else None
        if node is not None and _reaches(node, {id(n) for n in self._perturbed}):
            torch_class = next(c.__name__ for c in type(module).__mro__ if c.__module__.startswith("torch."))
            raise ValueError(
                f"{self.estimator}: a {torch_class} normalises by the batch's statistics the output of a Bayesian "
                "layer this estimator perturbs row by row: the statistics mix the rows, so the objective is no longer "
                "the ELBO of one weight draw. Train with estimator='reparam', or put the batch norm in evaluation "
                "mode (its running statistics)."
            )

    def site_of(self, value: torch.Tensor | None) -> str | None:
        """The site whose guide draw ``value`` is (by identity), or ``None``."""
        entry = self._drawn.get(id(value)) if value is not None else None
        return entry[1] if entry is not None and entry[0]() is value else None

    def start_run(self) -> None:
        """Forget which weight sites the previous model run's layer operations read, and the previous draws."""
        self._used.clear()
        self._outside.clear()
        self._perturbed.clear()
        self._drawn.clear()
        self._met.clear()
        self._layer_draws.clear()
        self._rows_per_site.clear()

    def affine(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, apply: Callable,
               feature_dims: int) -> torch.Tensor:
        """``apply(input, weight, bias)`` (torch's linear or convolution) for a ``weight`` the guide drew (a
        ``PyroSample`` weight), computed by this estimator as for a pyro_bbb layer; a bias the guide did not draw is
        added as it is."""
        if id(weight) in self._met:
            raise ValueError(
                f"{self.estimator}: the weight draw of site {self.site_of(weight)!r} enters torch's linear or "
                "convolution functions twice in one model run; each use would get its own perturbation, which is not "
                "one shared weight. Use the weight once per run (or pyro_bbb layers), or train without the handler."
            )
        self._met.add(id(weight))
        bias_site = self.site_of(bias)
        examples = example_draw_shape(tuple(input.shape), feature_dims, None) if weight.dim() == feature_dims + 1 \
            else None
        output = self._note_perturbed(self._estimate(input, weight, bias if bias_site else None, apply, feature_dims,
                                                     self.site_of(weight), bias_site, examples))
        if bias is None or bias_site:
            return output
        return output + bias.reshape(bias.shape + (1,) * (feature_dims - 1))

    def check_reached(self, sites: Iterable[str]) -> None:
        """A clear error when a weight site the guide drew with a posterior mean and scale reached neither a pyro_bbb
        layer nor torch's linear or convolution functions in the model run (e.g. a weight used elementwise): it would
        silently stay on plain reparameterization. A warning, once per site, for a layer's draw also read outside the
        layer's call (a tied weight).

        Examples
        --------
        >>> estimator = FlipoutMessenger()
        >>> estimator.check_reached(["fc.weight"])
        Traceback (most recent call last):
        ...
        ValueError: flipout reached no Bayesian layer operation for the weight sites ['fc.weight']: they are used ...
        """
        both = sorted(self._outside & self._used - self._warned_outside)
        if both:
            self._warned_outside.update(both)
            warn_at_caller(
                f"{self.estimator}: the weight draws of sites {both} are read outside their layer as well as used by "
                "it. The estimator replaces only the layer's use of the draw: if the other read enters the loss "
                "together with the layer's output (a tied weight, F.linear(h, layer.weight.T)), the two no longer "
                "share one weight and the objective is wrong; use each layer's weights through the layer alone, or "
                "train with estimator='reparam'. A read for logging, or an additive penalty, is harmless (as is "
                "layer.forward(x) called directly, which reads the weights outside layer(x)): ignore this then."
            )
        missed = sorted(set(sites) - self._used)
        if missed:
            raise ValueError(
                f"{self.estimator} reached no Bayesian layer operation for the weight sites {missed}: they are used "
                "neither by a pyro_bbb layer nor by torch's linear or convolution functions (e.g. elementwise), so it "
                "would leave them on plain reparameterization without a word. Build the network from pyro_bbb.nn "
                "layers (or pyro_bbb.bayesianize a torch.nn model), or train without the handler "
                "(estimator='reparam')."
            )

    def check_rows(self, batch_size: int | None, full_size: int | None = None) -> None:
        """A warning when, the batch being unknown to the layers (a hand-written model), a layer drew per row of an
        input whose rows are neither the data plate's ``batch_size`` examples nor its declared ``full_size``: if the
        rows are not the examples (tokens flattened into rows, a batch transposed), the positions of one example
        each got their own weights, a wrong expectation; if each example reads one row (a table of categories), the
        draws are exact.

        Examples
        --------
        >>> estimator = FlipoutMessenger()
        >>> estimator._rows_per_site["fc.weight"] = 40
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     estimator.check_rows(8)
        >>> "drew per row of a 40-row input to weight site 'fc.weight'" in str(caught[0].message)
        True
        """
        if batch_size is None:
            return
        for site, rows in self._rows_per_site.items():
            if rows not in (batch_size, full_size):
                warn_at_caller(
                    f"{self.estimator} drew per row of a {rows}-row input to weight site {site!r}, but the data plate "
                    f"holds {batch_size} examples. If the rows are not the examples (tokens flattened into rows, a "
                    "batch transposed), the positions of one example each get their own weights, a wrong "
                    "expectation: build the model with pyro_bbb.BNN (which tells its layers the batch), keep the "
                    "examples first in every Bayesian layer's input ((B, T, F) tokens are read right), or train "
                    "without the handler (estimator='reparam'). If each example reads one row (a table of "
                    "categories), the draws are exact and this can be ignored."
                )
                return

    def check_positions(self, input: torch.Tensor, weight_site: str | None,
                        examples: tuple[torch.Size, torch.Size] | None) -> None:
        """A clear error when this estimator cannot be exact (:attr:`positions_refusal`) for a layer whose input's
        rows hold several positions of one example, or are not the batch's rows: ``examples`` (where per-example
        draws go, from :func:`pyro_bbb._draws.example_draw_shape`) is then not ``None``. Those outputs share one
        weight draw.

        Examples
        --------
        >>> tokens = torch.zeros(2, 8, 3)                       # 2 examples of 8 tokens
        >>> examples = example_draw_shape(tuple(tokens.shape), 1, None)
        >>> FlipoutMessenger().check_positions(tokens, "fc.weight", examples)      # Flipout shares a draw: exact
        >>> LocalReparameterizationMessenger().check_positions(tokens, "fc.weight", examples)
        Traceback (most recent call last):
        ...
        ValueError: local reparameterization draws each output element on its own, but the layer of weight site ...
        """
        if examples is None or self.positions_refusal is None:
            return
        does, consequence = self.positions_refusal
        raise ValueError(
            f"{self.estimator} {does}, but the layer of weight site {weight_site!r} got an input of shape "
            f"{tuple(input.shape)} whose rows hold several positions of one example (tokens, steps), or are not the "
            f"batch's rows (a reshaped or transposed batch): those outputs share one weight draw, {consequence}. "
            "Train with estimator='flipout' (exact here) or 'reparam'."
        )

    def _pyro_weight_read_outside(self, msg: dict[str, Any]) -> None:
        site = self.site_of(msg["args"][0])
        if site is not None:
            self._outside.add(site)

    def _pyro_post_sample(self, msg: dict[str, Any]) -> None:
        self._layer_draws.pop(id(msg["value"]), None)  # sampled (or replayed) again: a new run's use is still to come
        posterior = drawn_posterior(msg)
        if posterior is not None:
            # the model's own sample site for a weight the guide drew (its draw seen at the guide's site, or the
            # handler wraps the model alone), not a pyro_bbb layer's: a PyroSample weight that reaches torch's F.linear
            # directly, where this estimator then meets it
            model_side = self._model_only or self.site_of(msg["value"]) is not None
            if not model_side:  # the guide draws again: a new run (also in Pyro's own loops, which start none)
                self._perturbed.clear()
            if model_side and self._interceptor is None and not is_layer_prior(msg["fn"]):
                self._interceptor = _DrawnWeightLinear(self)
                self._interceptor.__enter__()
            self.remember_posterior(msg["name"], *posterior)
            if len(self._drawn) > 4096:  # a handler kept across many runs outside pyro_bbb.ELBO: forget dead draws
                self._drawn = {k: v for k, v in self._drawn.items() if v[0]() is not None}
                self._met &= self._drawn.keys()
            self._drawn[id(msg["value"])] = (weakref.ref(msg["value"]), msg["name"])
            self._met.discard(id(msg["value"]))  # a new draw, though Python may reuse a freed one's id

    def remember_posterior(self, site: str, loc: torch.Tensor, scale: torch.Tensor) -> None:
        """Use ``Normal(loc, scale)`` as site ``site``'s posterior (what a guide's draw at that site tells it)."""
        self._posteriors[site] = (loc, scale)

    def _posterior(self, site: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        if site not in self._posteriors:
            raise ValueError(
                f"{self.estimator} needs the posterior mean and scale of site {site!r}, and the guide did not provide "
                "them. Use pyro_bbb.MeanFieldGuide (an independent Normal at every weight's own site); Pyro's "
                "AutoNormal, other autoguides and hand-written guides do not expose them. Prediction and prior "
                "draws need no estimator: run them outside the handler."
            )
        self._used.add(site)
        return self._posteriors[site]

    def _check_first_use(self, weight: torch.Tensor, kwargs: dict[str, Any]) -> None:
        """A clear error when a weight draw is perturbed a second time in one model run (a layer called twice, or a
        recurrent cell on a batch of another shape): each perturbation draws its own noise for one shared weight
        draw, a wrong expectation."""
        draw = kwargs.get("draw")
        draw = weight if draw is None else draw  # (the site's draw itself, not a view made of it for folded draws)
        met = self._layer_draws.get(id(draw))
        if met is not None and met() is draw:  # one draw (a layer called twice in a run), not a freed one's id
            raise ValueError(
                f"{self.estimator}: the layer of weight site {kwargs['weight_site']!r} is called twice in one model "
                "run (or, a recurrent cell, on a batch of another shape than at its first call); each call would get "
                "its own perturbation of what is one shared weight draw (a wrong expectation). Call each Bayesian "
                "layer once per run (a second layer for a second use; a cell on the whole batch at every step, "
                "masking the sequences that ended), or train without the handler (estimator='reparam')."
            )
        if len(self._layer_draws) > 4096:  # a handler kept across many runs outside pyro_bbb.ELBO: forget dead draws
            self._layer_draws = {k: ref for k, ref in self._layer_draws.items() if ref() is not None}
        self._layer_draws[id(draw)] = weakref.ref(draw)

    def _pyro_bayesian_affine(self, msg: dict[str, Any]) -> None:
        input, weight, bias = msg["args"]
        kwargs = msg["kwargs"]
        self._check_first_use(weight, kwargs)
        msg["value"] = self._note_perturbed(self._estimate(input, weight, bias, kwargs["apply"],
                                                           kwargs["feature_dims"], kwargs["weight_site"],
                                                           kwargs["bias_site"], kwargs.get("examples")))
        msg["done"] = True

    def _note_perturbed(self, output: torch.Tensor) -> torch.Tensor:
        """Keep the autograd node of a layer output this estimator drew per row (what a batch norm must not take
        its statistics from), this model run's only; ``output`` as it is."""
        if self.draws_per_row and output.grad_fn is not None:
            self._perturbed.append(output.grad_fn)
        return output

    def _estimate(self, input, weight, bias, apply, feature_dims, weight_site, bias_site, examples) -> torch.Tensor:
        """The layer's output under this estimator, from the posteriors of ``weight_site`` and ``bias_site``."""
        self.check_positions(input, weight_site, examples)
        if (self.draws_per_row and input.dim() > feature_dims and weight.dim() == feature_dims + 1
                and known_batch_rows() is None  # (a weight with draws: the rows are behind the particle dims)
                and (examples is None or examples[0][0] == input.shape[0])):  # (not one draw shared by all rows)
            self._rows_per_site[weight_site] = input.shape[0]  # (checked against the data plate: check_rows)
        weight_posterior = self._posterior(weight_site)
        bias_posterior = None if bias_site is None else self._posterior(bias_site)
        return self._output(input, weight, bias, apply, feature_dims, weight_posterior, bias_posterior, examples)

    def _output(self, input, weight, bias, apply, feature_dims, weight_posterior, bias_posterior,
                examples) -> torch.Tensor:
        """The layer's output under this estimator (``*_posterior`` are ``(loc, scale)`` pairs or None; ``examples``
        where per-example draws go, from :func:`pyro_bbb._draws.example_draw_shape`)."""
        raise NotImplementedError

    def _pyro_bayesian_affine_map(self, msg: dict[str, Any]) -> None:
        raise ValueError(
            f"{self.estimator} is not defined for recurrent weights: they are shared by all time steps, so their "
            "pre-activations cannot be drawn independently at each step. Train recurrent layers with "
            "pyro_bbb.flipout() (or plain reparameterization)."
        )


def _lead(batch_shape: torch.Size, weight: torch.Tensor, feature_dims: int) -> torch.Size:
    """Per-example leading dims: the input's batch dims broadcast with the weight's sample (particle) dims."""
    if weight.dim() == feature_dims + 1:  # one weight for every example (no particle dims): nothing to broadcast
        return torch.Size(batch_shape)
    return torch.broadcast_shapes(batch_shape, sample_dims(weight, feature_dims))


def _signs(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Independent random signs (+1 / -1) of the given shape."""
    # randint is cheaper than bernoulli_ on a CPU (benchmarks/step_time.py)
    return torch.randint(0, 2, shape, dtype=like.dtype, device=like.device).mul_(2).sub_(1)


class FlipoutMessenger(PosteriorReader):
    """Flipout (Wen et al. 2018): a different pseudo-independent weight perturbation for every example.

    With the guide's draws ``W = mu + dW`` and ``b = mu_b + db``, each Bayesian layer computes
    ``f(x, mu) + mu_b + (f(x * s_in, dW) + db) * s_out`` where ``s_in`` and ``s_out`` are independent random sign
    vectors per example (and per particle), over input and output features (channels for convolutions). Because
    every element of ``dW`` and ``db`` is symmetric about 0 and independent (mean field), each example's output
    has exactly the distribution it has under ``W``, so the ELBO and its gradient keep their expectation, while
    the examples of a batch become uncorrelated. The positions of one example (tokens ``(B, T, F)``, time steps)
    share its signs, as they share its weights; where a layer's rows are not the batch's (the net flattened or
    transposed it, as :class:`pyro_bbb.BNN` sees), or might not be (a position dimension as long as the rows, in
    :class:`pyro_bbb.BNN` or a hand-written model), one draw of signs serves all rows, which is exact. ``dW`` is the
    guide's own draw, so gradients reach the posterior mean (through ``mu``) and scale (through ``dW``). Costs about
    two forward passes per layer.

    Examples
    --------
    See :func:`flipout`.
    """

    estimator = "flipout"

    def _output(self, input, weight, bias, apply, feature_dims, weight_posterior, bias_posterior, examples):
        loc = weight_posterior[0]
        bias_loc = None if bias is None else bias_posterior[0]
        bias_delta = None if bias is None else bias - bias_loc
        mean = apply(input, loc, bias_loc)
        lead = _lead(input.shape[:-feature_dims], weight, feature_dims)
        features = (input.shape[-feature_dims] + mean.shape[-feature_dims],) + (1,) * (feature_dims - 1)
        # both sign vectors from one draw: three operations a layer instead of six
        if examples is None:  # one row per example
            signs = _signs(lead + features, input)
        else:  # one draw per example, shared by its positions (tokens share the example's weights)
            signs = _signs(examples[0] + features, input).expand(examples[1] + features).reshape(lead + features)
        sign_in, sign_out = signs.split([input.shape[-feature_dims], mean.shape[-feature_dims]], dim=-feature_dims)
        return torch.addcmul(mean, apply(input * sign_in, weight - loc, bias_delta), sign_out)


    def _pyro_bayesian_affine_map(self, msg: dict[str, Any]) -> None:
        """A recurrent weight's map for the whole sequence: signs drawn once per example, shared by all steps (once
        for all rows where they are not the batch's examples, as for the other layers)."""
        weight, bias = msg["args"]
        kwargs = msg["kwargs"]
        if kwargs["feature_dims"] != 1:
            raise NotImplementedError("flipout maps are implemented for linear (recurrent) weights only.")
        self._check_first_use(weight, kwargs)  # (a second map: its own signs for the same draw)
        apply = kwargs["apply"]
        loc, _ = self._posterior(kwargs["weight_site"])
        bias_loc = bias_delta = None
        if bias is not None:
            bias_loc, _ = self._posterior(kwargs["bias_site"])
            bias_delta = bias - bias_loc
        time = (1,) * kwargs["time_dims"]
        examples, rows = tuple(kwargs["example_shape"]), known_batch_rows()
        if examples and examples[-1] > 1 and rows is None and weight.dim() == 2:  # (a hand-written model: checked
            # against the data plate; one row is one draw of signs, exact)
            self._rows_per_site[kwargs["weight_site"]] = examples[-1]
        elif examples and rows is not None and examples[-1] != rows:  # the rows are not the examples (words of an
            examples = (*examples[:-1], 1)  # example as rows): one draw of signs for all of them, which is exact
        lead = _lead(torch.Size(examples), weight, 1)
        sign_in = _signs(lead + time + weight.shape[-1:], weight)
        sign_out = _signs(lead + time + weight.shape[-2:-1], weight)
        msg["value"] = FlipoutMap(loc, bias_loc, weight - loc, bias_delta, sign_in, sign_out, apply=apply,
                                  time_dims=len(time))
        msg["done"] = True


class LocalReparameterizationMessenger(PosteriorReader):
    """Local reparameterization (Kingma et al. 2015): sample each example's pre-activations, not the weights.

    For a mean-field Normal posterior a layer's output given its input is Gaussian with mean
    ``f(x, mu) + mu_b`` and variance ``f(x^2, sigma^2) + sigma_b^2``; the handler draws it with independent noise for
    every example (and particle), so the examples of a batch are independent and the gradient variance falls as
    1/B. Exact for linear layers on one row per example (each example's output has the same distribution as under a
    weight draw, and the ELBO's likelihood is a sum over examples); a layer whose rows hold several positions of one
    example (tokens ``(B, T, F)``, or rows that are not the batch's) is refused, since they share one weight it cannot
    draw. For convolutions each output position is drawn independently: its marginal is exact but the correlation
    between positions of one example (which share the kernel) is dropped, which changes the objective when later
    layers mix positions -- prefer :func:`flipout` for convolutional nets. The guide still draws the weights (for the
    KL); their values are not used by the layer.

    Examples
    --------
    See :func:`local_reparameterization`.
    """

    estimator = "local reparameterization"
    positions_refusal = ("draws each output element on its own",
                         "which it cannot draw exactly (their variance would be wrong)")

    def _output(self, input, weight, bias, apply, feature_dims, weight_posterior, bias_posterior, examples):
        loc, scale = weight_posterior
        bias_loc, bias_var = (None, None) if bias_posterior is None else (bias_posterior[0], bias_posterior[1] ** 2)
        mean = apply(input, loc, bias_loc)
        if mean.dtype in (torch.float16, torch.bfloat16):  # half precision (a model's, or autocast's): the variance
            with torch.autocast(input.device.type, enabled=False):  # in float32, where float16 made a posterior std
                variance = apply(input.float().pow(2), scale.float().pow(2),  # under 2.4e-4 zero and its tiny
                                 None if bias_var is None else bias_var.float())  # floored the std at 7.8e-3
        else:
            variance = apply(input.pow(2), scale.pow(2), bias_var)
        lead = _lead(mean.shape[:-feature_dims], weight, feature_dims)
        noise = torch.randn(lead + mean.shape[-feature_dims:], dtype=mean.dtype, device=mean.device)
        std = variance.clamp_min(torch.finfo(variance.dtype).tiny).sqrt().to(mean.dtype)
        return torch.addcmul(mean, std, noise)


def flipout(fn: Callable | None = None) -> FlipoutMessenger | Callable:
    """Train with Flipout: ``with pyro_bbb.flipout(): svi.step(x, y)``, or ``flipout(model)`` (or
    ``fit(..., estimator="flipout")``).

    Examples
    --------
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=0.5)
    >>> x = torch.ones(2, 3)                                  # two identical examples
    >>> with flipout():
    ...     out = pyro.poutine.replay(layer, trace=pyro.poutine.trace(guide).get_trace(x))(x)
    >>> bool((out[0] != out[1]).any())                        # yet different perturbations
    True
    """
    messenger = FlipoutMessenger()
    return messenger(fn) if fn is not None else messenger


def local_reparameterization(fn: Callable | None = None) -> LocalReparameterizationMessenger | Callable:
    """Train with local reparameterization: ``with pyro_bbb.local_reparameterization(): svi.step(x, y)``, or
    ``local_reparameterization(model)``.

    Examples
    --------
    >>> layer = BayesianLinear(3, 2)
    >>> guide = MeanFieldGuide(layer, init_scale=0.5)
    >>> x = torch.ones(4, 3)
    >>> with local_reparameterization():
    ...     out = pyro.poutine.replay(layer, trace=pyro.poutine.trace(guide).get_trace(x))(x)
    >>> out.shape
    torch.Size([4, 2])
    """
    messenger = LocalReparameterizationMessenger()
    return messenger(fn) if fn is not None else messenger


class MomentPropagationMessenger(PosteriorReader):
    """Deterministic variational inference (Wu et al. 2019): propagate means and variances, draw nothing.

    Each Bayesian layer returns the mean and variance of its output under the mean-field posterior, a
    :class:`pyro_bbb.nn.moments.Moments` (``mean = f(m, mu) + mu_b``,
    ``variance = f(m^2 + v, sigma^2) + sigma_b^2 + f(v, mu^2)`` for inputs of mean ``m`` and variance ``v``); the
    activations and reshapes of the user's ``forward`` map both moments (:mod:`pyro_bbb.nn.moments`), and the
    likelihood observes the expected log-likelihood in closed form. With :class:`pyro_bbb.MeanFieldGuide`, Normal
    priors and a fixed or heteroscedastic noise, the ELBO and its gradient are deterministic: no Monte Carlo noise.
    Exact for one hidden layer with a Gaussian likelihood; deeper, units are treated as independent Gaussians (the
    diagonal dDVI approximation), except the last linear layer's outputs, whose covariance a heteroscedastic
    likelihood uses. An operation it cannot follow, recurrent layers, a layer on tokens (several positions of one
    example share its weight draw, a covariance it drops: :meth:`~PosteriorReader.check_positions`), several
    particles and likelihoods without a closed form (categorical) are errors before any parameter changes.

    Examples
    --------
    See :func:`moment_propagation`.
    """

    estimator = "moment propagation"
    draws_per_row = False
    positions_refusal = ("treats each output element as an independent Gaussian",
                         "so they are correlated, and a later layer that mixes them (tokens flattened into a head, a "
                         "pooling) would get a wrong variance")

    def __enter__(self):
        self._modules = ExitStack()  # errors name the module that ran the operation
        self._modules.enter_context(tracking_modules())
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            handled = super().__exit__(*exc)
        finally:
            self._modules.close()
        error = exc[1]
        if type(error) is TypeError and "'Tensor' object is not callable" in str(error):
            raise MomentPropagationError(
                f"{error} under moment propagation: the network's activations are a pyro_bbb.nn.moments.Moments, "
                "whose .mean and .variance are its two tensors, so a pooling written `x.mean(dim)` calls a tensor. "
                "A mean over positions has no rule (they share one weight draw, and dropping their covariance would "
                "shrink the variance): train this network with estimator='flipout' (or 'reparam')."
            ) from error
        return handled

    def _output(self, input, weight, bias, apply, feature_dims, weight_posterior, bias_posterior, examples):
        if sample_dims(weight, feature_dims):
            raise ValueError(
                "moment propagation computes the expected log-likelihood exactly, so several weight draws (particles, "
                "or a vectorized plate around the model) add nothing; use num_particles=1."
            )
        return affine_moments(input, apply, weight_posterior, bias_posterior, linear=feature_dims == 1)


def moment_propagation(fn: Callable | None = None) -> MomentPropagationMessenger | Callable:
    """Train with deterministic variational inference: ``with pyro_bbb.moment_propagation(): svi.step(x, y)``, or
    ``moment_propagation(model)`` (or ``fit(..., estimator="moments")``).

    Examples
    --------
    >>> bnn = BNN(BayesianLinear(3, 1), likelihoods.Gaussian(scale=0.5))
    >>> guide = MeanFieldGuide(bnn)
    >>> elbo = pyro_bbb.ELBO(num_data=8)
    >>> x, y = torch.randn(8, 3), torch.randn(8)
    >>> with moment_propagation():
    ...     losses = [elbo.loss(bnn, guide, x, y) for _ in range(2)]
    >>> losses[0] == losses[1]                          # no Monte Carlo noise
    True
    """
    messenger = MomentPropagationMessenger()
    return messenger(fn) if fn is not None else messenger


#: Gradient estimators by name (``fit(estimator=...)``, the Lightning module): name -> a context to train in.
ESTIMATORS: dict[str, Callable[[], Any]] = {
    "reparam": nullcontext,
    "flipout": flipout,
    "local_reparam": local_reparameterization,
    "moments": moment_propagation,
}


def estimator(name: str) -> Callable[[], Any]:
    """The estimator called ``name`` in :data:`ESTIMATORS` (a factory of the context to train in), or a clear error.

    Examples
    --------
    >>> type(estimator("flipout")()).__name__
    'FlipoutMessenger'
    """
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; available: {sorted(ESTIMATORS)}.")
    return ESTIMATORS[name]


#: torch's convolutions: the number of spatial dims, whether transposed, and the names of the arguments after (input,
#: weight, bias) in their positional order.
_CONVOLUTIONS = {
    F.conv1d: (1, False, ("stride", "padding", "dilation", "groups")),
    F.conv2d: (2, False, ("stride", "padding", "dilation", "groups")),
    F.conv3d: (3, False, ("stride", "padding", "dilation", "groups")),
    F.conv_transpose1d: (1, True, ("stride", "padding", "output_padding", "groups", "dilation")),
    F.conv_transpose2d: (2, True, ("stride", "padding", "output_padding", "groups", "dilation")),
    F.conv_transpose3d: (3, True, ("stride", "padding", "output_padding", "groups", "dilation")),
}
#: torch's defaults for those arguments.
_CONVOLUTION_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "output_padding": 0}


class _DrawnWeightLinear(TorchFunctionMode):
    """Routes ``F.linear`` and convolution calls whose weight is a guide's draw (a ``PyroSample`` weight of a
    Pyro-style model, e.g. ``PyroModule[nn.Linear]`` or ``PyroModule[nn.Conv2d]``) to the estimator; every other call
    runs as it is. Entered only once such a weight is sampled, so pyro_bbb's own layers (which call the estimator
    directly) never pay for it."""

    def __init__(self, reader: PosteriorReader):
        super().__init__()
        self.reader = reader

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear or func in _CONVOLUTIONS:
            input, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            if self.reader.site_of(weight) is not None:
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                if func is F.linear:
                    return self.reader.affine(input, weight, bias, batched_linear, 1)
                spatial, transposed, names = _CONVOLUTIONS[func]
                settings = {k: _CONVOLUTION_DEFAULTS[k] for k in names} | dict(zip(names, args[3:]))
                settings |= {k: v for k, v in kwargs.items() if k in names}
                # batched: vectorized particles give the weight draw sample dims, as in pyro_bbb's conv layers
                apply = partial(batched_conv, spatial_dims=spatial, transposed=transposed, **settings)
                return self.reader.affine(input, weight, bias, apply, spatial + 1)
        return func(*args, **kwargs)


def _reaches(node, targets: set[int], limit: int = 100_000) -> bool:
    """Whether autograd node ``node`` is, or depends on, a node whose id is in ``targets`` (a walk of at most
    ``limit`` nodes: beyond it, not found)."""
    seen, stack = set(), [node]
    while stack and len(seen) < limit:
        current = stack.pop()
        if id(current) in targets:
            return True
        if id(current) in seen:
            continue
        seen.add(id(current))
        stack.extend(parent for parent, _ in current.next_functions if parent is not None)
    return False


def _run_model_inside(reader: PosteriorReader, fn: Callable, *args, **kwargs):
    """A model run inside ``reader`` as ``reader(model)`` wraps it: a new run, every draw the model's, and the checks
    of :meth:`PosteriorReader.check_reached` on the weights drawn in it at the end."""
    reader.start_run()
    reader._model_only = True
    try:
        with reader:
            value = fn(*args, **kwargs)
    finally:
        reader._model_only = False
    reader.check_reached(sorted({site for ref, site in reader._drawn.values() if ref() is not None}))
    return value


def started_estimators() -> list[PosteriorReader]:
    """The estimators active around a model-and-guide run, each told that a new run starts.

    Examples
    --------
    >>> with flipout():
    ...     len(started_estimators())
    1
    """
    estimators = active_messengers(PosteriorReader)
    for estimator in estimators:
        estimator.start_run()
    return estimators


def check_estimators_reached(estimators: list[PosteriorReader], guide_trace, frame=None) -> None:
    """A clear error when a weight the guide drew with a posterior mean and scale reached none of ``estimators``
    (it would silently stay on plain reparameterization; :meth:`PosteriorReader.check_reached`); a warning when one
    drew per row of rows that are not the examples of the data plate's ``frame`` (:meth:`PosteriorReader.check_rows`).

    Examples
    --------
    >>> check_estimators_reached([], None)
    """
    if not estimators:
        return
    weights = [n for n, site in guide_trace.nodes.items()
               if site["type"] == "sample" and drawn_posterior(site) is not None]
    for estimator in estimators:
        estimator.check_reached(weights)
        if frame is not None:
            estimator.check_rows(frame.size, frame.full_size)

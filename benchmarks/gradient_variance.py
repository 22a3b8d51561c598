"""Variance of the stochastic ELBO gradient against the batch size, for the three estimators (Wen et al. 2018, fig. 1).

A 64-100-10 Bayesian MLP on scikit-learn's digits (N = 1348), first fitted for 300 epochs (the calibrated fit of the
test suite, N(0, 2) prior) so that the posterior has realistic widths. For each batch size B and estimator, the
gradient of the per-datum loss with respect to the hidden layer's posterior means is drawn ``--repeats`` times:
"total" takes a fresh random minibatch and fresh weight noise for each draw (what SGD sees); "weights only" is the
variance over weight noise within a minibatch, averaged over 20 random minibatches. The table gives the variance
(mean over the 6400 elements) and the reduction ratios; the PNG is the log-log plot. With one weight draw shared by
the batch, plain reparameterization stops improving with B; Flipout and local reparameterization fall like 1/B.

    python benchmarks/gradient_variance.py            # table + benchmarks/figures/gradient_variance.png
    python benchmarks/gradient_variance.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

import pyro
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.data import digits
from pyro_bbb.nn import BayesianLinear

ESTIMATORS = {"reparam": nullcontext, "flipout": pyro_bbb.flipout, "local reparam": pyro_bbb.local_reparameterization}
SITE = "MeanFieldGuide.locs.net.0.weight"


def trained_model(x, y, epochs):
    pyro.clear_param_store()
    torch.manual_seed(0)
    prior = pyro_bbb.priors.Normal(0.0, 2.0)  # the digits set-up of tests/models.py: a well-calibrated fit
    net = torch.nn.Sequential(
        BayesianLinear(64, 100, prior=prior), torch.nn.ReLU(), BayesianLinear(100, 10, prior=prior)
    )
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=128, lr=1e-2, progress=False, seed=0)
    return bnn, guide


def gradient_variance(bnn, guide, x, y, batch, estimator, repeats, weights_only, draws_per_batch=10) -> float:
    """Mean over elements of the gradient variance. ``weights_only``: the variance over weight noise within a
    minibatch, averaged over ``repeats / draws_per_batch`` random minibatches (E_batch Var_w); else the variance
    over fresh minibatches and weight noise together."""
    num_data = x.shape[0]
    elbo = pyro_bbb.ELBO(num_data=num_data)
    loc = dict(pyro.get_param_store().named_parameters())[SITE]
    generator = torch.Generator().manual_seed(batch)
    grads = []
    for r in range(repeats):
        if not weights_only or r % draws_per_batch == 0:
            idx = torch.randperm(num_data, generator=generator)[:batch]
        with ESTIMATORS[estimator]():
            loss = elbo.differentiable_loss(bnn, guide, x[idx], y[idx]) / num_data
        grads.append(torch.autograd.grad(loss, loc)[0].reshape(-1))
    grads = torch.stack(grads)
    if weights_only:
        return float(grads.reshape(-1, draws_per_batch, grads.shape[-1]).var(1).mean())
    return float(grads.var(0).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "figures" / "gradient_variance.png")
    args = parser.parse_args()
    batches = [1, 16, 100] if args.quick else [1, 4, 16, 64, 100, 256, 1024]
    repeats = 20 if args.quick else args.repeats
    x, y, _, _ = digits()
    bnn, guide = trained_model(x, y, epochs=2 if args.quick else 300)
    summary = pyro_bbb.evaluate.diagnostics.layer_summary(bnn, guide)["net.0"]
    print(f"digits 64-100-10, N = {x.shape[0]}; posterior std / prior std of the hidden layer "
          f"{summary['std_ratio_geomean']:.2f} (geometric mean); {repeats} gradient draws per cell")
    results = {}
    for mode in ("total", "weights only"):
        print(f"\nvariance of d(loss per datum)/d(hidden-layer means), {mode}")
        print(f"  {'B':>5s} " + " ".join(f"{e:>14s}" for e in ESTIMATORS) + "   reparam/flipout  reparam/local")
        for batch in batches:
            row = {e: gradient_variance(bnn, guide, x, y, batch, e, repeats, mode != "total") for e in ESTIMATORS}
            results[mode, batch] = row
            ratios = f"{row['reparam'] / row['flipout']:15.1f}  {row['reparam'] / row['local reparam']:13.1f}"
            print(f"  {batch:5d} " + " ".join(f"{v:14.3e}" for v in row.values()) + f"   {ratios}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, mode in zip(axes, ("total", "weights only")):
        for estimator in ESTIMATORS:
            ax.loglog(batches, [results[mode, b][estimator] for b in batches], "o-", label=estimator)
        ideal = [results[mode, batches[0]]["flipout"] / b for b in batches]
        ax.loglog(batches, ideal, "k--", lw=1, label="1/B")
        ax.set(xlabel="batch size B", title=f"gradient variance ({mode})")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("variance of d loss / d mu (hidden layer)")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"\nfigure -> {args.out}")


if __name__ == "__main__":
    main()

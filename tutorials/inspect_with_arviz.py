# %% [markdown]
# # Inspecting a Bayes-by-Backprop posterior with ArviZ
#
# Train a small BNN on 1-D regression, export a set of posterior draws to ArviZ (`pyro_bbb.evaluate.to_inference_data`:
# posterior, posterior predictive, pointwise log-likelihood, observed and constant data, all from the *same*
# draws), read the per-layer summary table (`pyro_bbb.summary`), estimate the out-of-sample fit with PSIS-LOO,
# compare the KL weight `fit` chose against the Bayes posterior (`kl_weight=1`) on held-out rows, and save ArviZ's
# plots and ours as PNGs in `tutorials/figures/`.
#
# The export says which posterior it holds: a tempered one (a KL weight below 1, chosen on held-out rows by `fit`'s
# default) is narrower than the Bayes posterior, and the `posterior` group's attributes carry the weight and how it
# was chosen, so a plot or a saved file never passes one off as the other.
#
# A caution on what ArviZ reports for variational posteriors: the draws are independent samples from the guide,
# not a Markov chain, so ESS and R-hat say nothing about convergence (they are ~N and ~1 by construction). LOO is
# computed with `reff=1.0` for the same reason, and its Pareto k values tell you where the guide is too narrow
# for importance sampling: k > 0.7 flags data the posterior approximation explains poorly.
#
# And one on LOO of a tempered posterior: at KL weight w it counts every training row 1/w times, while PSIS-LOO takes
# out only w of a row's pull (its ratios are 1/p(y_i | w)), so its elpd is overstated and `az.compare` favours it
# (`to_inference_data` warns). Two posteriors at different weights are compared on rows neither was trained on.

# %%
import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import arviz as az  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.data import toy_regression  # noqa: E402
from pyro_bbb.evaluate import plots
from pyro_bbb.nn import BayesianLinear  # noqa: E402


def main(epochs: int, out_dir: Path, progress: bool = True) -> dict[str, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = toy_regression(200, seed=0)

    def train(**kl_weight):
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = torch.nn.Sequential(BayesianLinear(1, 20), torch.nn.Tanh(), BayesianLinear(20, 1))
        bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(prior_median=0.1))
        guide = pyro_bbb.MeanFieldGuide(bnn)
        history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=50, lr=1e-2, progress=progress,
                               seed=0, **kl_weight)
        return bnn, guide, history

    bnn, guide, history = train()  # the defaults: the KL weight chosen on a validation split
    print(history.kl_weight_choice.describe())

    # %% One set of draws for every group; the posterior group's attributes say which posterior it is.
    idata = pyro_bbb.evaluate.to_inference_data(bnn, guide, x, y, num_samples=500)
    print(idata)
    print({key: idata.posterior.attrs[key] for key in ("kl_weight", "kl_weight_chosen_by", "tempered_posterior")})

    # %% The posterior, layer by layer (exact: computed from the guide's means and scales).
    with_pandas_width = {"display.width": 160, "display.max_columns": 20}
    import pandas as pd

    with pd.option_context(*[item for pair in with_pandas_width.items() for item in pair]):
        print(pyro_bbb.summary(bnn, guide).round(3))
        print(pyro_bbb.evaluate.diagnostics.parameter_summary(bnn, guide).head(6).round(3))
        print(az.summary(idata, var_names=["net.2.bias", "likelihood.scale"], kind="stats").round(3))

    # %% Leave-one-out: reff=1.0 because the draws are independent.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ warns about high Pareto k; we report it ourselves
        loo = az.loo(idata, reff=1.0, pointwise=True)
    k = np.asarray(loo.pareto_k)
    print(f"PSIS-LOO elpd {loo.elpd_loo:.1f} (se {loo.se:.1f}), p_loo {loo.p_loo:.1f}; "
          f"Pareto k > 0.7 for {(k > 0.7).sum()} of {k.size} points")

    # %% ArviZ's plots on the export, and ours.
    az.plot_posterior(idata, var_names=["net.2.bias", "likelihood.scale"])
    plt.gcf().savefig(out_dir / "arviz_posterior.png", dpi=100)
    az.plot_forest(idata, var_names=["net.2.weight"], combined=True)
    plt.gcf().savefig(out_dir / "arviz_forest.png", dpi=100, bbox_inches="tight")
    az.plot_ppc(idata, num_pp_samples=100)
    plt.gcf().savefig(out_dir / "arviz_ppc.png", dpi=100)
    az.plot_loo_pit(idata, y="y")
    plt.gcf().savefig(out_dir / "arviz_loo_pit.png", dpi=100)
    plots.plot_std_ratio(bnn, guide, out_dir / "arviz_std_vs_prior.png")
    plots.plot_history(history, out_dir / "arviz_history.png")
    plt.close("all")
    print(f"figures -> {out_dir}/arviz_*.png")

    # %% The Bayes posterior (kl_weight=1) of the same net on the same data, against the chosen weight, on 1000 rows
    # of the same curve neither was trained on (the log-likelihood of each row under the mixture over 500 draws).
    # Last: training another model in Pyro's global param store replaces the first one's guide parameters.
    x_test, y_test = toy_regression(1000, seed=1)
    scores = {f"kl_weight {history.kl_weight_choice.kl_weight:g} (chosen)": pyro_bbb.evaluate.metrics.log_likelihood(
        pyro_bbb.predict(bnn, guide, x_test, num_samples=500), y_test)}
    bayes_bnn, bayes_guide, _ = train(kl_weight=1)
    scores["kl_weight 1 (Bayes)"] = pyro_bbb.evaluate.metrics.log_likelihood(
        pyro_bbb.predict(bayes_bnn, bayes_guide, x_test, num_samples=500), y_test)
    for name, score in scores.items():
        print(f"{name}: held-out log-likelihood {score:.3f} per row")
    bayes = pyro_bbb.evaluate.to_inference_data(bayes_bnn, bayes_guide, x, y, num_samples=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ warns about high Pareto k
        loo_bayes = az.loo(bayes, reff=1.0)
    print(f"PSIS-LOO elpd of the Bayes posterior {loo_bayes.elpd_loo:.1f} (se {loo_bayes.se:.1f}); "
          f"of the chosen one {loo.elpd_loo:.1f}, overstated if it is tempered")

    chosen, bayes_score = scores.values()
    return {"elpd_loo": float(loo.elpd_loo), "pareto_k_above_0.7": int((k > 0.7).sum()),
            "kl_weight": history.kl_weight_choice.kl_weight, "elpd_loo_bayes": float(loo_bayes.elpd_loo),
            "held_out_log_likelihood": chosen, "held_out_log_likelihood_bayes": bayes_score}


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir)

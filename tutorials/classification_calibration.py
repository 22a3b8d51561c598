# %% [markdown]
# # Calibrated classification: reliability, what the posterior learned, and inputs it has never seen
#
# scikit-learn's bundled digits (8x8 images) with a 64-100-10 Bayesian MLP (N(0, 2) prior) in the three-line style.
# Shows a reliability diagram (`plots.plot_reliability`), the posterior std of every weight against the prior's
# (`plots.plot_std_ratio`), the epistemic uncertainty (mutual information) of right and wrong answers, accuracy
# after pruning the weights with the lowest signal-to-noise ratio (Blundell et al. 2015), and how the predictive
# entropy splits into its aleatoric and epistemic parts on test digits and on uniform-noise inputs. Prints what
# `check_posterior` says. Writes `tutorials/figures/calibration_*.png`.

# %%
import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods, priors  # noqa: E402
from pyro_bbb.data import digits  # noqa: E402
from pyro_bbb.evaluate import diagnostics, metrics, plots
from pyro_bbb.evaluate.pruning import prune_by_snr  # noqa: E402
from pyro_bbb.nn import BayesianLinear  # noqa: E402


def main(epochs: int, out_dir: Path, progress: bool = True) -> dict[str, float]:
    # %% A 64-100-10 Bayesian MLP on the 8x8 digits, with an N(0, 2) prior (with N(0, 1) the posterior is
    # underconfident here), trained with the test set as validation data so the history shows its log-likelihood.
    out_dir.mkdir(parents=True, exist_ok=True)
    pyro.clear_param_store()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    prior = priors.Normal(0.0, 2.0)
    net = torch.nn.Sequential(BayesianLinear(64, 100, prior=prior), torch.nn.ReLU(),
                              BayesianLinear(100, 10, prior=prior))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=128, lr=1e-2,
                           validation_data=(x_test, y_test), progress=progress, seed=0)
    print(f"[digits] {history.kl_weight_choice.describe()}")  # chosen on a split of the training digits only
    history.plot(out_dir / "calibration_history.png")
    # %% How good and how calibrated the predictions are, and what `check_posterior` says about each layer.
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
    acc, ece = metrics.accuracy(pred, y_test), metrics.expected_calibration_error(pred, y_test)
    print(f"[digits] accuracy {acc:.1%}, ECE {ece:.3f}, Brier {metrics.brier_score(pred, y_test):.3f}, "
          f"test log-lik {metrics.log_likelihood(pred, y_test):.3f}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = diagnostics.check_posterior(bnn, guide)
    for layer, entry in report.items():
        if "std_ratio" in entry:
            print(f"[digits] {layer}: KL {entry['kl']:.0f} nats, posterior/prior std {entry['std_ratio_geomean']:.2f} "
                  f"(geometric mean), status {entry['status']}")
    for w in caught:
        print(f"[digits] warning: {w.message}")

    # %% Pruning by signal-to-noise: remove the weights with the lowest |mu| / sigma and measure the accuracy left.
    fractions = [0.0, 0.5, 0.75, 0.9, 0.95, 0.98]
    pruned_accuracy = []
    for fraction in fractions:
        pruned, _ = prune_by_snr(guide, fraction)
        pruned_accuracy.append(metrics.accuracy(pyro_bbb.predict(bnn, pruned, x_test, num_samples=50), y_test))
    table = ", ".join(f"{f:.0%}: {a:.1%}" for f, a in zip(fractions, pruned_accuracy))
    print(f"[digits] accuracy after pruning: {table}")

    # %% The reliability diagram: predicted confidence against observed accuracy, bin by bin.
    plots.plot_reliability(pred, y_test, path=out_dir / "calibration_reliability.png")

    # %% Each weight's posterior std against its prior's: mass at the prior line is weight the data does not need.
    plots.plot_std_ratio(bnn, guide, path=out_dir / "calibration_std_vs_prior.png")

    # %% Out-of-distribution inputs, uniform noise "images": the epistemic uncertainty (mutual information) should
    # flag them, and it should be higher for the digits the network gets wrong than for those it gets right.
    noise = torch.rand(len(x_test), 64, generator=torch.Generator().manual_seed(1))
    outside = pyro_bbb.predict(bnn, guide, noise, num_samples=100)
    for label, p in (("test digits", pred), ("uniform noise", outside)):
        print(f"[digits] {label}: mean predictive entropy {float(p.predictive_entropy.mean()):.3f}, "
              f"mean mutual information {float(p.mutual_information.mean()):.3f}")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[2].scatter(pred.expected_entropy, pred.mutual_information, s=6, alpha=0.5, label="test digits")
    axes[2].scatter(outside.expected_entropy, outside.mutual_information, s=6, alpha=0.5, label="uniform noise")
    axes[2].set(xlabel="expected entropy (aleatoric), nats", ylabel="mutual information (epistemic), nats",
                title="in- vs out-of-distribution")
    axes[2].legend(fontsize=8)
    wrong = pred.predicted_class != y_test
    mi = pred.mutual_information
    bins = torch.linspace(0, float(mi.max()) + 1e-6, 30)
    axes[0].hist(mi[~wrong], bins=bins, alpha=0.6, density=True, label=f"right ({int((~wrong).sum())})")
    axes[0].hist(mi[wrong], bins=bins, alpha=0.6, density=True, label=f"wrong ({int(wrong.sum())})")
    axes[0].set(xlabel="mutual information (nats)", ylabel="density", title="epistemic uncertainty", yscale="log")
    axes[0].legend(fontsize=8)
    axes[1].plot([100 * f for f in fractions], [100 * a for a in pruned_accuracy], "o-")
    axes[1].set(xlabel="% of weights removed (lowest |mu|/sigma)", ylabel="test accuracy (%)",
                title="pruning by signal-to-noise")
    fig.tight_layout()
    fig.savefig(out_dir / "calibration_uncertainty.png", dpi=110)
    plt.close("all")
    return {"accuracy": acc, "ece": ece, "pruned_90_accuracy": pruned_accuracy[fractions.index(0.9)]}



# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir)

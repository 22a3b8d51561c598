# %% [markdown]
# # What the uncertainty buys: unseen classes, selective prediction and temperature scaling
#
# A user picks a Bayesian net for what its uncertainty buys, so measure that against what they would use instead.
# scikit-learn's digits, trained on the classes 0-7; the test digits 8 and 9 are inputs of classes the nets have
# never seen (out of distribution). A pyro_bbb BNN with its defaults against a deterministic net of the same shape,
# before and after post-hoc temperature scaling (fitted on a held-out tenth of the training split): accuracy, NLL,
# ECE (equal-width and equal-mass bins), how well the predictive entropy flags the unseen classes (AUROC, FPR at 95%
# TPR) and the risk of predicting only the surest inputs (AURC, the risk at 80% coverage). `benchmarks/uncertainty.py`
# runs the full comparison (MC dropout, a 5-net ensemble, last-layer Laplace, Flipout, IVON; three tasks, three
# seeds). Writes `tutorials/figures/uncertainty_*.png`.

# %%
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.data import digits  # noqa: E402
from pyro_bbb.evaluate import metrics, plots  # noqa: E402
from pyro_bbb.evaluate.calibration import TemperatureScaling, fit_temperature  # noqa: E402
from pyro_bbb.nn import BayesianLinear  # noqa: E402
from pyro_bbb.prediction import ClassificationPrediction  # noqa: E402


def report(name: str, inside, outside, y) -> dict[str, float]:
    """Every number of one predictive, printed on one line."""
    row = {"accuracy": metrics.accuracy(inside, y), "NLL": -metrics.log_likelihood(inside, y),
           "ECE": metrics.expected_calibration_error(inside, y, num_bins=15),
           "adaptive ECE": metrics.adaptive_calibration_error(inside, y),
           "OOD AUROC": metrics.ood_auroc(inside, outside), "FPR@95": metrics.fpr_at_tpr(inside, outside),
           "AURC": metrics.aurc(inside, y), "risk@80%": metrics.risk_at_coverage(inside, y, 0.8)}
    print(f"{name:>26}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    return row


def as_prediction(probs: torch.Tensor) -> ClassificationPrediction:
    """A deterministic net's (or a rescaled) class probabilities as a one-draw pyro_bbb prediction."""
    return ClassificationPrediction(pyro.distributions.Categorical(probs=probs[None].float()),
                                    torch.zeros(1, probs.shape[0]))


def main(epochs: int, out_dir: Path, progress: bool = True) -> dict[str, dict[str, float]]:
    # %% The digits 0-7 for training (a tenth held out for temperature scaling), the test digits 0-7 in distribution,
    # 8 and 9 out of it.
    out_dir.mkdir(parents=True, exist_ok=True)
    pyro.clear_param_store()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    x_train, y_train = x_train[y_train < 8], y_train[y_train < 8]
    x_val, y_val, x_fit, y_fit = x_train[:100], y_train[:100], x_train[100:], y_train[100:]
    x_in, y_in, x_out = x_test[y_test < 8], y_test[y_test < 8], x_test[y_test >= 8]

    # %% The BNN: pyro_bbb's defaults (He-scaled priors, MeanFieldGuide, Adam, the KL weight chosen from the data)
    # on a 64-100-100-8 MLP.
    net = torch.nn.Sequential(BayesianLinear(64, 100), torch.nn.ReLU(), BayesianLinear(100, 100), torch.nn.ReLU(),
                              BayesianLinear(100, 8))
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    history = pyro_bbb.fit(bnn, guide, (x_fit, y_fit), epochs=epochs, batch_size=64, progress=progress, seed=0)
    print(history.kl_weight_choice.describe())  # chosen on a split of x_fit; x_val stays for temperature scaling
    bnn_in = pyro_bbb.predict(bnn, guide, x_in, num_samples=100)
    bnn_out = pyro_bbb.predict(bnn, guide, x_out, num_samples=100)

    # %% The deterministic twin: the same MLP with torch.nn.Linear, cross-entropy and Adam for the same epochs.
    torch.manual_seed(0)
    det = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(), torch.nn.Linear(100, 100), torch.nn.ReLU(),
                              torch.nn.Linear(100, 8))
    optimizer = torch.optim.Adam(det.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(epochs):
        for idx in torch.randperm(len(y_fit)).split(64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(det(x_fit[idx]), y_fit[idx]).backward()
            optimizer.step()
    with torch.no_grad():
        det_in, det_out, det_val = (torch.softmax(det(x), -1) for x in (x_in, x_out, x_val))

    # %% Temperature scaling, fitted on the held-out tenth: the deterministic net's softmax, and the BNN's predictive
    # (fit_temperature refuses data the guide was trained on).
    det_scaling = TemperatureScaling().fit(det_val, y_val)
    bnn_scaling = fit_temperature(bnn, guide, (x_val, y_val))
    print(f"temperatures: deterministic {det_scaling.temperature:.2f}, BNN {bnn_scaling.temperature:.2f}")
    predictions = {
        "deterministic": (as_prediction(det_in), as_prediction(det_out)),
        "deterministic + temperature": (as_prediction(det_scaling(det_in)), as_prediction(det_scaling(det_out))),
        "pyro_bbb BNN": (bnn_in, bnn_out),
        "pyro_bbb BNN + temperature": (as_prediction(bnn_scaling(bnn_in)), as_prediction(bnn_scaling(bnn_out))),
    }
    results = {name: report(name, inside, outside, y_in) for name, (inside, outside) in predictions.items()}

    # %% Look: reliability, risk against coverage, and the predictive entropy on seen and unseen classes.
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    plots.plot_reliability(bnn_in, y_in, ax=axes[0], title="BNN reliability")
    plots.plot_risk_coverage({name: inside for name, (inside, _) in predictions.items()}, y_in, ax=axes[1])
    axes[1].set(xlim=(0.5, 1.0))
    plots.plot_ood_scores(bnn_in, bnn_out, ax=axes[2], title="BNN, digits 8-9 unseen")
    fig.savefig(out_dir / "uncertainty_digits.png", dpi=110, bbox_inches="tight")
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.5))
    plots.plot_ood_scores(*predictions["deterministic"], ax=axes[0], title="deterministic")
    plots.plot_ood_scores(bnn_in, bnn_out, score="mutual_information", ax=axes[1], title="BNN, epistemic")
    fig.savefig(out_dir / "uncertainty_ood_scores.png", dpi=110, bbox_inches="tight")
    plt.close("all")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir)

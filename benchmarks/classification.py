"""Calibrated classification on bundled data: a deterministic net, the full BbB posterior, a Bayesian last layer.

scikit-learn's digits (8x8 images, 10 classes) and breast-cancer (30 features, 2 classes), features scaled on the
training split; a 1-hidden-layer ReLU MLP (100 units). Reports accuracy, NLL, ECE and Brier score on the test split,
and out-of-distribution detection on digits: AUROC of the predictive entropy and of the mutual information for
test digits against uniform-noise images (higher is better; a deterministic net has no mutual information).

    python benchmarks/classification.py            # prints the table
    python benchmarks/classification.py --quick    # smoke run
"""

from __future__ import annotations

import argparse

import pyro
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score
from torch import nn

import pyro_bbb
from pyro_bbb import likelihoods, priors
from pyro_bbb.data import digits
from pyro_bbb.evaluate import metrics
from pyro_bbb.nn import BayesianLinear


def breast_cancer(seed: int = 0):
    data = load_breast_cancer()
    x, y = torch.as_tensor(data.data, dtype=torch.float32), torch.as_tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, train = perm[: len(y) // 4], perm[len(y) // 4 :]
    mean, std = x[train].mean(0), x[train].std(0)
    return (x[train] - mean) / std, y[train], (x[test] - mean) / std, y[test]


def make(kind: str, inputs: int, classes: int) -> nn.Module:
    prior = priors.Normal(0.0, 2.0)
    first = nn.Linear(inputs, 100) if kind != "full BbB" else BayesianLinear(inputs, 100, prior=prior)
    last = nn.Linear(100, classes) if kind == "deterministic" else BayesianLinear(100, classes, prior=prior)
    return nn.Sequential(first, nn.ReLU(), last)


def evaluate(kind, data, epochs, ood=None):
    x_train, y_train, x_test, y_test = data
    classes = int(y_train.max()) + 1
    pyro.clear_param_store()
    torch.manual_seed(0)
    bnn = pyro_bbb.BNN(make(kind, x_train.shape[1], classes), likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn)
    pyro_bbb.fit(bnn, guide, (x_train, y_train), epochs=epochs, batch_size=128, lr=1e-2, progress=False, seed=0)
    pyro.set_rng_seed(0)
    pred = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
    row = {
        "accuracy": metrics.accuracy(pred, y_test),
        "NLL": -metrics.log_likelihood(pred, y_test),
        "ECE": metrics.expected_calibration_error(pred, y_test),
        "Brier": metrics.brier_score(pred, y_test),
    }
    if ood is not None:
        outside = pyro_bbb.predict(bnn, guide, ood, num_samples=100)
        labels = torch.cat([torch.zeros(len(x_test)), torch.ones(len(ood))])
        for name in ("predictive_entropy", "mutual_information"):
            scores = torch.cat([getattr(pred, name), getattr(outside, name)])
            row[f"AUROC {name.split('_')[-1]}"] = float(roc_auc_score(labels.numpy(), scores.numpy()))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    epochs = 2 if args.quick else 300
    sets = {"digits": digits(), "breast cancer": breast_cancer()}
    noise = torch.rand(450, 64, generator=torch.Generator().manual_seed(1))  # uniform-noise "images" in [0, 1]
    print("| data | model | accuracy | NLL | ECE | Brier | OOD AUROC entropy | OOD AUROC mutual information |")
    print("|---|---|---|---|---|---|---|---|")
    for name, data in sets.items():
        for kind in ("deterministic", "full BbB", "Bayesian last layer"):
            row = evaluate(kind, data, epochs, ood=noise if name == "digits" else None)
            ood = (f"{row['AUROC entropy']:.3f} | {row['AUROC information']:.3f}" if "AUROC entropy" in row
                   else "– | –")
            print(f"| {name} | {kind} | {row['accuracy']:.3f} | {row['NLL']:.3f} | {row['ECE']:.3f} | "
                  f"{row['Brier']:.3f} | {ood} |", flush=True)


if __name__ == "__main__":
    main()

# %% [markdown]
# # A Bayesian head on a Hugging Face transformer: calibration on a small, noisy text task
#
# A 2-layer BERT (hidden size 32) built from a config -- nothing is downloaded -- classifies token sequences:
# label 1 when token 5 occurs, with 20% of the labels flipped and only 120 training sequences, so that a
# deterministic fine-tune memorises the noise and becomes overconfident. The same architecture is trained three
# ways for the same number of epochs: deterministic (plain PyTorch, cross-entropy), with a Bayesian
# classification head (`bayesianize(include=["classifier"])`), and with the last encoder block, the pooler and the
# head Bayesian. The inputs are a transformers `BatchEncoding` (input ids and attention mask) passed straight to
# `fit` and `predict`; `BNN` reads the `logits` of the model's output. Prints accuracy, expected calibration error
# and test log-likelihood; plots reliability diagrams side by side and the epistemic uncertainty (mutual
# information) on test sequences against sequences of tokens never seen in training.
# Writes `tutorials/figures/transformer_calibration.png`.
#
# The posteriors start at `init_scale=0.05`: at the library default (1e-4) a few hundred steps cannot widen
# them, and the "Bayesian" model would be a point estimate (see `History`'s posterior/prior std ratio).

# %%
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import pyro_bbb  # noqa: E402
from pyro_bbb import likelihoods, metrics, plots  # noqa: E402

VOCAB, LENGTH, MARKER = 24, 12, 5


def tiny_bert(seed: int = 0) -> transformers.BertForSequenceClassification:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def token_task(n: int, seed: int, noise: float = 0.2, tokens: tuple[int, int] = (6, VOCAB)):
    """Sequences of ``tokens`` (after [CLS]=1, padded with 0 to ``LENGTH``); label 1 when ``MARKER`` occurs, flipped
    with probability ``noise``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(*tokens, (n, LENGTH), generator=g)
    clean = torch.randint(0, 2, (n,), generator=g)
    lengths = torch.randint(4, LENGTH + 1, (n,), generator=g)
    position = (torch.rand(n, generator=g) * (lengths - 1)).long() + 1
    ids[clean.bool(), position[clean.bool()]] = MARKER
    ids[:, 0] = 1
    mask = (torch.arange(LENGTH) < lengths.unsqueeze(-1)).long()
    y = torch.where(torch.rand(n, generator=g) < noise, 1 - clean, clean)
    return transformers.BatchEncoding({"input_ids": ids * mask, "attention_mask": mask}), y


def train_deterministic(x, y, epochs: int, lr: float, batch_size: int) -> torch.Tensor:
    model = tiny_bert()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(0)
    for _ in range(epochs):
        for idx in torch.randperm(len(y)).split(batch_size):
            loss = torch.nn.functional.cross_entropy(model(**{k: v[idx] for k, v in x.items()}).logits, y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def main(epochs: int, out_dir: Path, progress: bool = True) -> dict[str, dict[str, float]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    x, y = token_task(120, seed=0)
    x_test, y_test = token_task(2000, seed=1)
    unseen, _ = token_task(500, seed=2, tokens=(2, 5))  # tokens 2-4 never occur in training
    lr, batch_size = 3e-3, 32

    deterministic = train_deterministic(x, y, epochs, lr, batch_size)
    with torch.no_grad():
        probs = {"deterministic": deterministic(**x_test).logits.softmax(-1)}
    predictions = {}
    for label, include in (("Bayesian head", ["classifier"]),
                           ("Bayesian last block + head", ["bert.encoder.layer.1", "bert.pooler", "classifier"])):
        pyro.clear_param_store()
        # the three lines: convert, wrap with a likelihood, fit (the BatchEncoding is the x)
        net = pyro_bbb.bayesianize(tiny_bert(), include=include)
        bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
        guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.05)
        history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=batch_size, lr=lr, progress=progress,
                               seed=0)  # fmt: skip
        net.eval()
        predictions[label] = (pyro_bbb.predict(bnn, guide, x_test, num_samples=100),
                              pyro_bbb.predict(bnn, guide, unseen, num_samples=100))  # fmt: skip
        probs[label] = predictions[label][0].probs
        ratio = torch.tensor(list(history.last["std_ratio"].values())).median()
        print(f"[transformer] {label}: {sum(isinstance(m, pyro_bbb.nn.BayesianModule) for m in net.modules())} "
              f"Bayesian layers, median posterior/prior std {float(ratio):.2f}")  # fmt: skip

    results = {}
    for label, p in probs.items():
        results[label] = {
            "accuracy": metrics.accuracy(p, y_test),
            "ece": metrics.expected_calibration_error(p, y_test),
            "log_likelihood": float(p[torch.arange(len(y_test)), y_test].clamp_min(1e-12).log().mean()),
        }
        r = results[label]
        print(f"[transformer] {label:28s} accuracy {r['accuracy']:.3f}  ECE {r['ece']:.3f}  "
              f"test log-lik {r['log_likelihood']:.3f}")  # fmt: skip

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for ax, (label, p) in zip(axes, probs.items()):
        plots.plot_reliability(p, y_test, ax=ax, title=label)
    ax = axes[3]
    for i, (label, (inside, outside)) in enumerate(predictions.items()):
        ax.hist(inside.mutual_information, bins=40, alpha=0.5, density=True, color=f"C{2 * i}",
                label=f"{label}: test")  # fmt: skip
        ax.hist(outside.mutual_information, bins=40, alpha=0.5, density=True, color=f"C{2 * i + 1}",
                label=f"{label}: unseen tokens")  # fmt: skip
        results[label]["mi_test"] = float(inside.mutual_information.mean())
        results[label]["mi_unseen"] = float(outside.mutual_information.mean())
        print(f"[transformer] {label}: mean mutual information {results[label]['mi_test']:.3f} on test sequences, "
              f"{results[label]['mi_unseen']:.3f} on sequences of unseen tokens")  # fmt: skip
    ax.set(xlabel="mutual information (nats)", ylabel="density", title="epistemic uncertainty")
    ax.legend(fontsize=7)
    fig.tight_layout()
    plots.save_figure(fig, out_dir / "transformer_calibration.png")
    plt.close("all")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir)

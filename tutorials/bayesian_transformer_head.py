# %% [markdown]
# # A Bayesian head on a Hugging Face transformer: calibration on a small, noisy text task
#
# A 2-layer BERT (hidden size 32) built from a config -- nothing is downloaded -- classifies token sequences:
# label 1 when token 5 occurs, with 20% of the labels flipped and only 120 training sequences, so that a
# deterministic fine-tune memorises the noise and becomes overconfident. The same architecture is trained three
# ways for the same number of epochs, each from three seeds: deterministic (plain PyTorch, cross-entropy), with a
# Bayesian classification head (`bayesianize(include=["classifier"])`), and with the last encoder block, the pooler
# and the head Bayesian. The inputs are a transformers `BatchEncoding` (input ids and attention mask) passed straight to
# `fit` and `predict`; `BNN` reads the `logits` of the model's output. Prints accuracy, expected calibration error
# and test log-likelihood per approach (mean and range over the seeds); plots reliability diagrams side by side
# (test predictions of all seeds pooled) and the epistemic uncertainty (mutual information) on test sequences
# against sequences of tokens never seen in training.
# Writes `tutorials/figures/transformer_calibration.png`.
#
# Measured (150 epochs, 3 seeds, 2-core CPU, 157 s; mean and range over the seeds), with `fit`'s defaults: the KL
# weight chosen on 10% of the 120 training sequences after a MAP warm start:
#
# | model | accuracy | ECE | test log-likelihood |
# |---|---|---|---|
# | deterministic | 0.728 (0.699-0.771) | 0.206 (0.087-0.288) | -1.226 (-1.978 to -0.587) |
# | Bayesian head | 0.706 (0.653-0.761) | 0.111 (0.018-0.268) | -0.720 (-1.005 to -0.550) |
# | Bayesian last block + head | 0.787 (0.762-0.805) | 0.055 (0.030-0.077) | -0.524 (-0.548 to -0.503) |
#
# The deterministic fine-tune memorises the flipped labels and is overconfident. The selection keeps the Bayes
# posterior (KL weight 1) for every model and seed: on the 12 held-out sequences weight 1 scored best (e.g. validation
# NLL 0.52, 0.50, 0.38 for 0.01, 0.1, 1) or within a standard error of the best (0.68 at 0.01 against 0.94: twelve
# rows are a noisy judge, and the rule keeps the Bayes posterior when it cannot tell). With the last encoder
# block Bayesian too, the net is both more accurate and calibrated (with 20% of the labels flipped, 0.8 is the best
# accuracy there is, and its confidence sits at 0.7-0.8); a Bayesian head alone halves the deterministic net's ECE
# but varies from seed to seed.
#
# What this model does *not* do: flag sequences of unseen tokens by their mutual information (as printed below, the
# same on unseen-token sequences as on test sequences for either model): the token embeddings are deterministic,
# and an unseen token's embedding is simply its random initial value -- make the embeddings Bayesian too (they are
# not converted) to ask that question.
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
from pyro_bbb import likelihoods  # noqa: E402
from pyro_bbb.evaluate import metrics, plots

VOCAB, LENGTH, MARKER = 24, 12, 5


def tiny_bert(seed: int = 0) -> transformers.BertForSequenceClassification:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
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


def train_deterministic(x, y, epochs: int, lr: float, batch_size: int, seed: int):
    model = tiny_bert(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y)).split(batch_size):
            loss = torch.nn.functional.cross_entropy(model(**{k: v[idx] for k, v in x.items()}).logits, y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


BAYESIAN = {"Bayesian head": ["classifier"],
            "Bayesian last block + head": ["bert.encoder.layer.1", "bert.pooler", "classifier"]}


def train_bayesian(include, x, y, epochs: int, lr: float, batch_size: int, seed: int, progress: bool):
    pyro.clear_param_store()
    # the three lines: convert, wrap with a likelihood, fit (the BatchEncoding is the x)
    net = pyro_bbb.bayesianize(tiny_bert(seed), include=include)
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.05)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=epochs, batch_size=batch_size, lr=lr, progress=progress,
                           seed=seed)
    net.eval()
    return bnn, guide, history


def main(epochs: int, out_dir: Path, progress: bool = True, seeds: int = 3) -> dict[str, dict[str, float]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    x, y = token_task(120, seed=0)
    x_test, y_test = token_task(2000, seed=1)
    unseen, _ = token_task(500, seed=2, tokens=(2, 5))  # tokens 2-4 never occur in training
    lr, batch_size = 3e-3, 32

    # %% Each seed trains the three models on the same 120 noisy sequences; the Bayesian ones report the KL weight
    # `fit` chose and how wide their posteriors ended, relative to the prior.
    probs = {label: [] for label in ("deterministic", *BAYESIAN)}  # test probabilities, one tensor per seed
    information = {label: ([], []) for label in BAYESIAN}  # mutual information: test / unseen tokens
    for seed in range(seeds):
        deterministic = train_deterministic(x, y, epochs, lr, batch_size, seed)
        with torch.no_grad():
            probs["deterministic"].append(deterministic(**x_test).logits.softmax(-1))
        for label, include in BAYESIAN.items():
            bnn, guide, history = train_bayesian(include, x, y, epochs, lr, batch_size, seed, progress)
            inside = pyro_bbb.predict(bnn, guide, x_test, num_samples=100)
            outside = pyro_bbb.predict(bnn, guide, unseen, num_samples=100)
            probs[label].append(inside.probs)
            information[label][0].append(inside.mutual_information)
            information[label][1].append(outside.mutual_information)
            ratio = float(torch.tensor(list(history.last["std_ratio"].values())).median())
            print(f"[transformer] seed {seed} {label}: KL weight {history.kl_weight_choice.kl_weight:g}, "
                  f"median posterior/prior std {ratio:.2f}")

    # %% Accuracy, calibration and test log-likelihood per model, over the seeds.
    results = {}
    for label, per_seed in probs.items():
        scores = torch.tensor([[metrics.accuracy(p, y_test), metrics.expected_calibration_error(p, y_test),
                                float(p[torch.arange(len(y_test)), y_test].clamp_min(1e-12).log().mean())]
                               for p in per_seed])
        results[label] = dict(zip(("accuracy", "ece", "log_likelihood"), scores.mean(0).tolist()))
        results[label]["worst_ece"] = float(scores[:, 1].max())
        cells = "  ".join(f"{name} {m:.3f} ({lo:.3f}-{hi:.3f})" for name, m, lo, hi in
                          zip(("accuracy", "ECE", "test log-lik"), scores.mean(0), scores.min(0).values,
                              scores.max(0).values))
        print(f"[transformer] {label:28s} over {seeds} seeds, mean (min-max): {cells}")

    # %% Reliability diagrams (all seeds' test predictions pooled) and the mutual information on test sequences
    # against sequences of tokens never seen in training.
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    y_pooled = y_test.repeat(seeds)
    for ax, (label, per_seed) in zip(axes, probs.items()):
        plots.plot_reliability(torch.cat(per_seed), y_pooled, ax=ax, title=f"{label}, {seeds} seeds")
    ax = axes[3]
    for i, (label, (inside, outside)) in enumerate(information.items()):
        inside, outside = torch.cat(inside), torch.cat(outside)
        bins = torch.linspace(0, float(max(inside.max(), outside.max())) + 1e-6, 40)
        ax.hist(inside, bins=bins, alpha=0.5, density=True, color=f"C{2 * i}", label=f"{label}: test")
        ax.hist(outside, bins=bins, alpha=0.5, density=True, color=f"C{2 * i + 1}", label=f"{label}: unseen tokens")
        results[label]["mi_test"], results[label]["mi_unseen"] = float(inside.mean()), float(outside.mean())
        print(f"[transformer] {label}: mean mutual information {results[label]['mi_test']:.3f} on test sequences, "
              f"{results[label]['mi_unseen']:.3f} on sequences of unseen tokens")
    ax.set(xlabel="mutual information (nats)", ylabel="density", title="epistemic uncertainty")
    ax.legend(fontsize=7)
    plots.save_figure(fig, out_dir / "transformer_calibration.png")
    plt.close("all")
    return results


# %%
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=Path("tutorials/figures"))
    args = parser.parse_args()
    main(args.epochs, args.out_dir, seeds=args.seeds)

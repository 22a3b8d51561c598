"""``bayesianize`` on Hugging Face transformers models built from small configs (nothing is downloaded)."""

import pyro
import pytest
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear

transformers = pytest.importorskip("transformers")


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(config)


def token_task(n=240, length=10, seed=0):
    """Label 1 when the sequence contains token 5 (anywhere after [CLS]); padded tails are masked out."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 24, (n, length), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    lengths = torch.randint(4, length + 1, (n,), generator=g)
    position = (torch.rand(n, generator=g) * (lengths - 1)).long() + 1
    ids[y.bool(), position[y.bool()]] = 5
    ids[:, 0] = 1
    mask = (torch.arange(length) < lengths.unsqueeze(-1)).long()
    ids = ids * mask  # 0 is [PAD]
    return transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask}), y


LINEARS = 14  # 6 per block, the pooler and the classifier


@pytest.mark.parametrize(
    "include, converted",
    [(["classifier"], 1), (["bert.encoder.layer.1", "bert.pooler", "classifier"], 8), (None, LINEARS)],
    ids=["head", "last-block-and-head", "all-linear"],
)
def test_bayesianized_bert_trains_predicts_and_round_trips(include, converted, tmp_path):
    x, y = token_task()
    net = pyro_bbb.bayesianize(tiny_bert(), include=include)
    assert sum(isinstance(m, BayesianLinear) for m in net.modules()) == converted
    bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=1e-3)
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=4, batch_size=40, lr=5e-3, progress=False, seed=0, kl_weight=1)
    assert history["nll"][-1] < history["nll"][0]
    pyro.set_rng_seed(0)
    prediction = pyro_bbb.predict(bnn, guide, x, num_samples=10, vectorize=True)  # checked against one draw alone
    assert prediction.probs.shape == (len(y), 2) and torch.allclose(prediction.probs.sum(-1), torch.ones(len(y)))
    assert prediction.mutual_information.shape == (len(y),) and bool((prediction.mutual_information >= 0).all())
    if include == ["classifier"]:  # a Bayesian head learns this task in a few epochs
        assert float((prediction.predicted_class == y).float().mean()) > 0.95

    path = tmp_path / "bert.pt"
    pyro_bbb.save(path, bnn, guide)
    pyro.clear_param_store()
    fresh_bnn = pyro_bbb.BNN(pyro_bbb.bayesianize(tiny_bert(seed=1), include=include), likelihoods.Categorical())
    fresh_guide = pyro_bbb.load(path, fresh_bnn, pyro_bbb.MeanFieldGuide(fresh_bnn))
    pyro.set_rng_seed(0)
    again = pyro_bbb.predict(fresh_bnn, fresh_guide, x, num_samples=10, vectorize=True)
    torch.testing.assert_close(again.probs, prediction.probs)


def test_a_model_output_and_a_tuple_output_are_read_alike():
    x, y = token_task(n=20)
    outputs = {}
    for return_dict in (True, False):
        net = pyro_bbb.bayesianize(tiny_bert(), include=["classifier"])
        net.config.return_dict = return_dict  # False: a tuple whose first element is the logits
        bnn = pyro_bbb.BNN(net, likelihoods.Categorical())
        pyro.clear_param_store()
        guide = pyro_bbb.MeanFieldGuide(bnn)
        pyro.set_rng_seed(0)
        with pytest.warns(UserWarning, match="never trained"):  # the converted weights' initial posterior
            outputs[return_dict] = pyro_bbb.predict(bnn, guide, x, num_samples=4).probs
    torch.testing.assert_close(outputs[True], outputs[False])

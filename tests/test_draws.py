"""Weight draws folded into the batch: user code inside BNN sees ordinary batches (pyro_bbb._draws)."""

import warnings

import pyro
import pyro.poutine as poutine
import pytest
import torch

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb._draws import UnfoldableRowsError, batch_rows, draws_leading, fold_draws, folded_draws, unfold_rows
from pyro_bbb.nn import BayesianConv2d, BayesianGRU, BayesianLinear, BayesianLSTM, BayesianLSTMCell
from pyro_bbb.prediction import UntrainedGuideWarning

from .helpers import BatchCentred, Routed


def vectorized_and_loop(model, x, y, num_samples=6, init_scale=0.2):
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=init_scale)
    guide(x, y)
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the vectorized pass is trusted
        warnings.filterwarnings("ignore", category=UntrainedGuideWarning)  # the guides are random, on purpose
        vectorized = pyro_bbb.predict(model, guide, x, num_samples=num_samples, vectorize=True)
    pyro.set_rng_seed(0)
    loop = pyro_bbb.predict(model, guide, x, num_samples=num_samples, vectorize=False)
    return vectorized, loop


def assert_same_draws(vectorized, loop):
    base_v, base_l = vectorized.distribution, loop.distribution
    for name in ("loc", "logits"):
        if hasattr(base_l, name) and name in base_l.__dict__:
            torch.testing.assert_close(getattr(base_v, name), getattr(base_l, name), rtol=1e-5, atol=1e-5)


class LastStep(torch.nn.Module):
    def __init__(self, cell="lstm"):
        super().__init__()
        self.rnn = BayesianLSTM(3, 5, batch_first=True) if cell == "lstm" else BayesianGRU(3, 5, batch_first=True)
        self.head = BayesianLinear(5, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_lstm_last_step_out_of_batch_first_output_is_vectorized_and_equals_the_loop(cell):
    x, y = torch.randn(7, 7, 3), torch.randint(0, 2, (7,))  # batch size == sequence length: no shape error to help
    vectorized, loop = vectorized_and_loop(pyro_bbb.BNN(LastStep(cell), likelihoods.Categorical()), x, y)
    assert vectorized.probs.shape == (7, 2)
    assert_same_draws(vectorized, loop)


class TimeMajor(torch.nn.Module):
    """Time-major GRU (two layers, bidirectional) and an LSTM cell: batch in dimension 1, then 0."""

    def __init__(self):
        super().__init__()
        self.rnn = BayesianGRU(3, 4, num_layers=2, bidirectional=True)
        self.cell = BayesianLSTMCell(8, 3)
        self.head = BayesianLinear(3 + 4, 1)

    def forward(self, x):
        out, h_n = self.rnn(x.transpose(0, 1))
        h, c = self.cell(out[-1])
        h, c = self.cell(out[0], (h, c))
        return self.head(torch.cat([h, h_n[-1]], dim=1))


def test_time_major_recurrent_layers_cells_and_states_are_vectorized_and_equal_the_loop():
    x, y = torch.randn(9, 5, 3), torch.randn(9)
    vectorized, loop = vectorized_and_loop(pyro_bbb.BNN(TimeMajor(), likelihoods.Gaussian(scale=0.1)), x, y)
    assert_same_draws(vectorized, loop)


class ViewCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = BayesianConv2d(1, 3, 3, padding=1)
        self.fc = BayesianLinear(3 * 16 + 2, 4)

    def forward(self, x):
        z = torch.relu(self.conv(x))
        z = torch.nn.functional.max_pool2d(z, 2).view(z.size(0), -1)
        z = torch.cat([z, x.mean((1, 2, 3)).unsqueeze(1), x.flatten(1).max(1).values.unsqueeze(1)], dim=1)
        return self.fc(z)


def test_view_by_batch_size_cat_on_dim_1_and_mean_over_dims_are_vectorized_and_equal_the_loop():
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 4, (6,))
    vectorized, loop = vectorized_and_loop(pyro_bbb.BNN(ViewCat(), likelihoods.Categorical()), x, y)
    assert_same_draws(vectorized, loop)


def test_converted_cnn_with_batchnorm_maxpool_flatten_is_vectorized_and_equals_the_loop():
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3),
    )
    cnn(torch.randn(32, 1, 8, 8))  # running statistics
    bnn = pyro_bbb.BNN(pyro_bbb.bayesianize(cnn), likelihoods.Categorical()).eval()
    x, y = torch.randn(10, 1, 8, 8), torch.randint(0, 3, (10,))
    vectorized, loop = vectorized_and_loop(bnn, x, y)
    assert_same_draws(vectorized, loop)


def test_flipout_vectorized_particles_see_ordinary_batches():
    seen = []

    class Recording(torch.nn.Module):
        def forward(self, h):
            seen.append(tuple(h.shape))
            return h

    net = torch.nn.Sequential(BayesianLinear(3, 4), Recording(), BayesianLinear(4, 1))
    bnn = pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.1))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    x, y = torch.randn(10, 3), torch.randn(10)
    elbo = pyro_bbb.ELBO(num_data=10, num_particles=5, vectorize_particles=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=UntrainedGuideWarning)  # the guides are random, on purpose
        with pyro_bbb.flipout():
            elbo.loss_and_grads(bnn, guide, x, y)
    # 5 particles x 10 rows as an ordinary batch (the guide's set-up and the one-particle check see 10 rows)
    assert (50, 4) in seen and set(seen) == {(10, 4), (50, 4)}
    assert elbo.pairs.current.vectorized_ok


def test_vectorized_particles_equal_sequential_ones_for_a_last_step_model():
    """With a near-point posterior every particle gives the same loss: vectorized (folded) == sequential."""
    bnn = pyro_bbb.BNN(LastStep(), likelihoods.Categorical())
    x, y = torch.randn(7, 7, 3), torch.randint(0, 2, (7,))
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=1e-6)
    guide(x, y)
    vectorized = pyro_bbb.ELBO(num_data=70, num_particles=4, vectorize_particles=True).loss(bnn, guide, x, y)
    sequential = pyro_bbb.ELBO(num_data=70, num_particles=4).loss(bnn, guide, x, y)
    assert vectorized == pytest.approx(sequential, rel=1e-4)


def test_vectorized_particles_of_a_model_reading_draws_as_batch_fall_back_to_one_at_a_time():
    model = BatchCentred()
    x, y = torch.randn(20, 3), torch.randn(20)
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.3)
    elbo = pyro_bbb.ELBO(num_data=20, num_particles=4, vectorize_particles=True)
    with pytest.warns(UserWarning, match="one at a time"):
        elbo.loss(model, guide, x, y)
    assert elbo.pairs.current.vectorized_ok is False
    # the fallback is the sequential estimator: the same expected loss (here: near-point posterior, same value)
    pyro.clear_param_store()
    guide = pyro_bbb.MeanFieldGuide(model, init_scale=1e-6)
    guide(x, y)
    with pytest.warns(UserWarning, match="one at a time"):
        vectorized = pyro_bbb.ELBO(num_data=20, num_particles=4, vectorize_particles=True).loss(model, guide, x, y)
    assert vectorized == pytest.approx(pyro_bbb.ELBO(num_data=20).loss(model, guide, x, y), rel=1e-4)


def test_fold_helpers():
    with fold_draws(3):
        assert folded_draws() == 3
    assert folded_draws() is None
    with pytest.raises(ValueError, match="multiple|10 rows"):
        unfold_rows(torch.zeros(10, 2), 3)
    with batch_rows(4):  # 3 draws of 4 rows: 12 rows, or a whole multiple of them (positions folded into the rows)
        assert unfold_rows(torch.zeros(24, 2), 3).shape == (3, 8, 2)
        with pytest.raises(UnfoldableRowsError, match="selected some of its rows"):
            unfold_rows(torch.zeros(6, 2), 3)  # a multiple of 3, but not 3 blocks of the batch's rows
    with pytest.raises(ValueError, match="carries 4 draws"):
        draws_leading(torch.zeros(4, 1, 2, 2), 2, 3)


def test_a_layer_on_rows_a_bayesian_gate_selected_is_refused_not_split_into_equal_blocks():
    """A mixture's expert on ``x[mask]``, the mask from a Bayesian gate: each weight draw selects rows of its own.
    Draw 0 routes no row to the expert, draw 1 all four: the expert's four rows were split into two blocks of two,
    and draw 1's first two rows got draw 0's expert (10 and 20 where 20 and 40 are right), in silence -- draw 0
    alone, which predict compares, was right. Now a clear error; where no draw routes a row, nothing to split."""
    bnn = pyro_bbb.BNN(Routed(), likelihoods.Gaussian(scale=1.0))
    x = torch.arange(1.0, 5.0).unsqueeze(1)

    def folded(gate):
        draws = {"net.gate.weight": torch.tensor(gate).reshape(2, 1, 1, 1),
                 "net.expert.weight": torch.tensor([10.0, 20.0]).reshape(2, 1, 1, 1)}
        with pyro.plate("draws", 2, dim=-2), poutine.condition(data=draws):
            return bnn.observation(x)[0].mean.reshape(2, 4)

    with pytest.raises(UnfoldableRowsError, match="selected some of its rows.*vectorize=False"):
        folded([-1.0, 1.0])
    assert torch.equal(folded([-1.0, -1.0]), torch.zeros(2, 4))


def test_predict_of_a_routed_net_runs_one_draw_at_a_time_and_vectorize_true_says_why():
    """Each draw of the gate routes 3 or 4 of the rows (the positive or the negative ones) to the expert: predict
    runs the draws one at a time (the loop's numbers), and vectorize=True names the problem and the fix."""
    bnn = pyro_bbb.BNN(Routed(), likelihoods.Gaussian(scale=1.0))
    x = torch.arange(-4.0, 4.0).unsqueeze(1)
    guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=1.0)
    guide(x, torch.zeros(8))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UntrainedGuideWarning)  # a random guide, on purpose
        pyro.set_rng_seed(1)
        with pytest.warns(UserWarning, match="selected some of its rows.*one call per draw"):
            vectorized = pyro_bbb.predict(bnn, guide, x, num_samples=8)
        pyro.set_rng_seed(1)
        loop = pyro_bbb.predict(bnn, guide, x, num_samples=8, vectorize=False)
        with pytest.raises(ValueError, match=r"vectorize=True.*selected some of its rows"):
            pyro_bbb.predict(bnn, guide, x, num_samples=8, vectorize=True)
    torch.testing.assert_close(vectorized.distribution.loc, loop.distribution.loc)

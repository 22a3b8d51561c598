"""Every pyro_bbb warning points at the user's own line, whatever path raised it (``warn_at_caller``)."""

import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb._warnings import warn_at_caller
from pyro_bbb.nn import BayesianLinear


class ReadsTheBatchFromTheLeft(PyroModule):
    """A hand-written model whose ``view`` cannot take predict's extra draw dimension (it falls back, with a word)."""

    def __init__(self):
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([3, 1]).to_event(2))

    def forward(self, x, y=None):
        out = (x @ self.w).view(x.shape[0])
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(out, 0.5), obs=y)


def _caught(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return caught


def test_a_warning_raised_directly_points_at_its_caller():
    (caught,) = _caught(lambda: warn_at_caller("look here", RuntimeWarning))
    assert caught.filename == __file__ and caught.category is RuntimeWarning


def test_predict_s_fallback_points_at_the_user_s_line_from_predict_and_from_fit_s_selection():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(40, 3), torch.randn(40)
    model = ReadsTheBatchFromTheLeft()
    guide = pyro_bbb.MeanFieldGuide(model)
    from_fit = _caught(lambda: pyro_bbb.fit(model, guide, (x, y), epochs=6, progress=False, seed=0))
    from_predict = _caught(lambda: pyro_bbb.predict(model, guide, x, num_samples=4))
    for caught, said_by in ((from_fit, "fit, scoring the KL weight's candidates: "), (from_predict, "predict: ")):
        fallbacks = [w for w in caught if "one call per draw" in str(w.message)]
        assert fallbacks and all(w.filename == __file__ for w in fallbacks)
        assert all(str(w.message).startswith(said_by) for w in fallbacks)  # the function the user called


def test_the_num_data_warning_of_a_pyro_svi_step_points_at_the_step():
    pyro.clear_param_store()
    bnn = pyro_bbb.BNN(BayesianLinear(3, 1), likelihoods.Gaussian(0.5))
    guide = pyro_bbb.MeanFieldGuide(bnn)
    svi = pyro.infer.SVI(bnn, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    caught = _caught(lambda: svi.step(torch.randn(8, 3), torch.randn(8)))
    (warning,) = [w for w in caught if "num_data" in str(w.message)]
    assert warning.filename == __file__


def test_a_warning_raised_under_a_training_frameworks_loop_points_past_it_to_the_users_line():
    """Lightning's Trainer calls training_step from its own loop: the warning points at the user's trainer.fit line,
    not into the lightning package (read by module name, installed or not)."""
    import os

    ours = {"__name__": "pyro_bbb.train.lightning", "warn_at_caller": warn_at_caller}  # a frame of pyro_bbb's own
    exec(compile("def training_step():\n    warn_at_caller('look here')\n",
                 os.path.join(os.path.dirname(pyro_bbb.__file__), "train", "lightning.py"), "exec"), ours)
    loop = {"__name__": "lightning.pytorch.loops.fit_loop"}
    exec(compile("def run_loop(step):\n    step()\n", "/site-packages/lightning/pytorch/loops/fit_loop.py", "exec"),
         loop)
    (caught,) = _caught(lambda: loop["run_loop"](ours["training_step"]))
    assert caught.filename == __file__

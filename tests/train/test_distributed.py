"""Two gloo processes on CPU, launched by the test itself, against one process on the global batch."""

import os
import time
import warnings
from pathlib import Path

import pyro
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

import pyro_bbb
from pyro_bbb import likelihoods
from pyro_bbb.nn import BayesianLinear


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    return x, torch.tanh(x.sum(-1)) + 0.1 * torch.randn(40, generator=g)


def _model(batchnorm=False):
    torch.manual_seed(0)
    middle = torch.nn.BatchNorm1d(8) if batchnorm else torch.nn.Tanh()
    net = torch.nn.Sequential(BayesianLinear(2, 8), middle, BayesianLinear(8, 1))
    return pyro_bbb.BNN(net, likelihoods.Gaussian(scale=0.2))


def _summed_gradients(local_batch, loss):
    """The mis-scaled variant: gradients summed over ranks, so the KL is counted once per rank."""
    params = [p for _, p in sorted(pyro.get_param_store().named_parameters())]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
    return loss, local_batch


def _worker(rank, world, init_file, out_dir, mode):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        pyro.clear_param_store()
        x, y = _data()
        bnn = _model(batchnorm=mode == "batchnorm")
        guide = pyro_bbb.MeanFieldGuide(bnn, init_scale=0.05)
        if mode == "misscaled":
            pyro_bbb.train.distributed.combine_gradients = _summed_gradients
        if mode == "nan":
            if rank == 1:
                x = x.clone()
                x[5] = float("nan")
            data = DataLoader(TensorDataset(x[rank::world], y[rank::world]), batch_size=8)
            kwargs = {}
        else:
            data, kwargs = (x, y), {"batch_size": 16 // world}
        if mode == "early":  # rank 0 validates on data it gets worse at, rank 1 on data it gets better at: they
            g = torch.Generator().manual_seed(10)  # must still stop and rewind alike
            x_val = torch.randn(20, 2, generator=g)
            kwargs |= {"validation_data": (x_val, (1 if rank else -1) * torch.tanh(x_val.sum(-1))),
                       "early_stopping": pyro_bbb.EarlyStopping(patience=2)}
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            history = pyro_bbb.fit(bnn, guide, data, epochs=30 if mode == "early" else 3, lr=0.02, seed=0,
                                   progress=False, distributed=True, **kwargs)
        state = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
        buffers = {k: v.detach().clone() for k, v in bnn.named_buffers()}
        torch.save({"params": state, "nll": history["nll"], "buffers": buffers,
                    "epochs": [len(history), history.best_epoch or 0],
                    "choice": history.kl_weight_choice.to_dict(),
                    "fallback_warnings": sum("did not choose the KL weight" in str(w.message) for w in said)},
                   Path(out_dir) / f"{mode}-{world}-{rank}.pt")
    except Exception as error:  # noqa: BLE001 - reported to the test through a file
        (Path(out_dir) / f"{mode}-{world}-{rank}.err").write_text(f"{type(error).__name__}: {error}")
    finally:
        dist.destroy_process_group()


def _launch(tmp_path, world, mode, timeout=120, attempt=1):
    init_file = tmp_path / f"init-{mode}-{world}-{attempt}"
    context = mp.start_processes(_worker, args=(world, str(init_file), str(tmp_path), mode), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.time() + timeout
    try:
        while not context.join(timeout=1):
            if time.time() > deadline:
                for process in context.processes:
                    process.terminate()
                pytest.fail(f"{mode} with {world} processes did not finish within {timeout} s (a rank hung)")
    except mp.ProcessExitedException as error:
        # a rank killed by a signal, not an error of ours (those are written to a file and compared): gloo's C++
        # threads have once aborted a rank ("terminate called without an active exception") on a loaded 2-core CI
        # machine, and 7 later runs of the same code passed. One fresh try; a second death fails the test.
        if error.signal_name is None or attempt > 1:
            raise
        warnings.warn(f"{mode} with {world} processes: a rank died by {error.signal_name}; launching once more",
                      stacklevel=2)
        for stale in tmp_path.glob(f"{mode}-{world}-*"):  # (what the other rank wrote before it)
            stale.unlink()
        return _launch(tmp_path, world, mode, timeout, attempt + 1)
    return [tmp_path / f"{mode}-{world}-{rank}" for rank in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ddp")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return {(mode, world): _launch(tmp_path, world, mode) for mode, world in
            (("fit", 1), ("fit", 2), ("misscaled", 2), ("nan", 2), ("batchnorm", 2), ("early", 2))}


def _params(path):
    assert not path.with_suffix(".err").exists(), path.with_suffix(".err").read_text()
    return torch.load(path.with_suffix(".pt"), weights_only=True)


@pytest.mark.slow
def test_two_ranks_equal_one_process_on_the_global_batch(runs):
    reference = _params(runs["fit", 1][0])
    ranks = [_params(p) for p in runs["fit", 2]]
    for result in ranks:  # same parameters on every rank, and the same as one process
        assert result["params"].keys() == reference["params"].keys()
        for name, value in reference["params"].items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-5, atol=1e-6)
        assert result["nll"] == pytest.approx(reference["nll"], rel=1e-5)
    wrong = _params(runs["misscaled", 2][0])["params"]
    gap = max(float((wrong[k] - v).abs().max()) for k, v in reference["params"].items())
    assert gap > 1e-3  # counting the KL on every rank is measurably another objective


@pytest.mark.slow
def test_distributed_fit_trains_at_weight_one_and_says_so_once(runs):
    """kl_weight="auto" cannot split the data across ranks: every rank records weight 1 and why; rank 0 warns."""
    ranks = [_params(p) for p in runs["fit", 2]]
    for result in ranks:
        choice = result["choice"]
        assert choice["kl_weight"] == 1.0 and choice["chosen_by"] == "fallback" and "distributed" in choice["reason"]
    assert [result["fallback_warnings"] for result in ranks] == [1, 0]


@pytest.mark.slow
def test_nan_on_one_rank_stops_every_rank_with_the_same_clear_error(runs):
    messages = [p.with_suffix(".err").read_text() for p in runs["nan", 2]]
    assert all("NaN" in m for m in messages), messages
    assert "ValueError" in messages[1] and "rank 1 failed" in messages[0]


@pytest.mark.slow
def test_batchnorm_running_statistics_follow_rank_0(runs):
    ranks = [_params(p) for p in runs["batchnorm", 2]]
    assert "net.1.running_mean" in ranks[0]["buffers"]
    for name, value in ranks[0]["buffers"].items():  # each rank saw other data, yet holds rank 0's statistics
        torch.testing.assert_close(ranks[1]["buffers"][name], value, rtol=0, atol=0)
    assert float(ranks[0]["buffers"]["net.1.running_var"].sub(1).abs().max()) > 1e-3  # they did move


def test_distributed_needs_a_process_group():
    x, y = _data()
    bnn = _model()
    with pytest.raises(ValueError, match="init_process_group"):
        pyro_bbb.fit(bnn, pyro_bbb.MeanFieldGuide(bnn), (x, y), epochs=1, distributed=True, progress=False)


def test_distributed_under_module_local_params_is_a_clear_error_before_anything_changes():
    x, y = _data()
    with pyro.settings.context(module_local_params=True):  # the guide's parameters live in the modules
        bnn = _model()
        guide = pyro_bbb.MeanFieldGuide(bnn)
        guide(x, y)
        before = {name: value.detach().clone() for name, value in guide.named_parameters()}
        with pytest.raises(ValueError, match=r"module_local_params=True.*set\(module_local_params=False\)"):
            pyro_bbb.fit(bnn, guide, (x, y), epochs=1, distributed=True, progress=False)
        assert before and all(torch.equal(value, dict(guide.named_parameters())[name])
                              for name, value in before.items())


@pytest.mark.slow
def test_early_stopping_stops_and_rewinds_every_rank_alike(runs):
    ranks = [_params(p) for p in runs["early", 2]]
    (length, best), other = ranks[0]["epochs"], ranks[1]["epochs"]
    assert [length, best] == other and length == best + 2 < 30  # stopped early, at the same epoch on both ranks
    for name, value in ranks[0]["params"].items():
        torch.testing.assert_close(ranks[1]["params"][name], value, rtol=0, atol=0)

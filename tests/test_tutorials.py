"""The tutorials run end to end (few epochs) and write their figures."""

import importlib.util
import math
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def load(name):
    spec = importlib.util.spec_from_file_location(name, TUTORIALS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quickstart(tmp_path):
    results = load("quickstart").main(epochs=10, out_dir=tmp_path, progress=False)
    assert (tmp_path / "quickstart_band.png").exists() and (tmp_path / "quickstart_history.png").exists()
    assert results["test_rmse"] < 2.0 and results["epistemic_ratio"] > 0


@pytest.mark.slow
def test_uncertainty_baselines(tmp_path):
    results = load("uncertainty_baselines").main(epochs=3, out_dir=tmp_path, progress=False)
    assert set(results) == {"deterministic", "deterministic + temperature", "pyro_bbb BNN",
                            "pyro_bbb BNN + temperature"}
    assert all(0.0 <= row["OOD AUROC"] <= 1.0 and row["NLL"] > 0 for row in results.values())
    # temperature scaling keeps the predicted class
    assert results["deterministic"]["accuracy"] == results["deterministic + temperature"]["accuracy"]
    for name in ("digits", "ood_scores"):
        assert (tmp_path / f"uncertainty_{name}.png").stat().st_size > 10_000


@pytest.mark.slow
def test_regression_uncertainty(tmp_path):
    tutorial = load("regression_uncertainty")
    tutorial.main(epochs=3, out_dir=tmp_path, progress=False)
    assert (tmp_path / "regression_uncertainty.png").stat().st_size > 10_000
    results = tutorial.compare_estimators(steps=5, out_dir=tmp_path, progress=False)
    assert set(results) == set(tutorial.ESTIMATORS) and (tmp_path / "regression_estimators.png").stat().st_size > 10_000


@pytest.mark.slow
def test_classification_calibration(tmp_path):
    load("classification_calibration").main(epochs=3, out_dir=tmp_path, progress=False)
    for name in ("uncertainty", "history", "reliability", "std_vs_prior"):
        assert (tmp_path / f"calibration_{name}.png").stat().st_size > 10_000


@pytest.mark.slow
def test_inspect_with_arviz(tmp_path):
    results = load("inspect_with_arviz").main(epochs=5, out_dir=tmp_path, progress=False)
    assert all(math.isfinite(results[key]) for key in ("elpd_loo", "elpd_loo_bayes", "held_out_log_likelihood",
                                                       "held_out_log_likelihood_bayes"))
    assert results["kl_weight"] in (1.0, 0.1, 0.01)
    for name in ("posterior", "forest", "ppc", "loo_pit", "std_vs_prior", "history"):
        assert (tmp_path / f"arviz_{name}.png").stat().st_size > 5_000


@pytest.mark.slow
def test_bayesian_lstm_reber(tmp_path):
    tutorial = load("bayesian_lstm_reber")
    results = tutorial.main(epochs=1, num_train=64, out_dir=tmp_path, progress=False)
    assert len(results) == 5 and (tmp_path / "reber_curves.png").stat().st_size > 10_000
    finals = tutorial.convergence_over_seeds(seeds=1, epochs=1, num_train=64, out_dir=tmp_path, max_len=10)
    assert [len(v) for v in finals.values()] == [1, 1, 1] and (tmp_path / "reber_seeds.png").stat().st_size > 10_000


@pytest.mark.slow
def test_kl_scaling_explained(tmp_path):
    results = load("kl_scaling_explained").main(regression_epochs=2, digits_epochs=1, out_dir=tmp_path)
    assert len(results["std_ratio"]) == 5 and (tmp_path / "kl_scaling.png").exists()


@pytest.mark.slow
def test_why_is_my_kl_flat(tmp_path):
    results = load("why_is_my_kl_flat").main(epochs=2, out_dir=tmp_path)
    assert len(results) == 3 and (tmp_path / "why_is_my_kl_flat.png").exists()


@pytest.mark.slow
def test_bayesian_transformer_head(tmp_path):
    pytest.importorskip("transformers")
    results = load("bayesian_transformer_head").main(epochs=2, out_dir=tmp_path, progress=False, seeds=1)
    assert set(results) == {"deterministic", "Bayesian head", "Bayesian last block + head"}
    assert (tmp_path / "transformer_calibration.png").stat().st_size > 10_000


@pytest.mark.slow
def test_natural_gradient(tmp_path):
    results = load("natural_gradient").main(epochs=3, out_dir=tmp_path, progress=False)
    assert set(results) == {"Adam-BbB", "IVON"} and all(
        math.isfinite(r["test_log_likelihood"]) for r in results.values()
    )
    assert (tmp_path / "natural_gradient.png").stat().st_size > 10_000


@pytest.mark.slow
def test_pyro_style_models(tmp_path):
    results = load("pyro_style_models").main(epochs=2, out_dir=tmp_path, progress=False, draws=20)
    assert results["moments"]["gradient_std"] == 0.0
    assert results["flipout"]["gradient_std"] < results["reparam"]["gradient_std"]
    assert (tmp_path / "pyro_style_models.png").stat().st_size > 10_000

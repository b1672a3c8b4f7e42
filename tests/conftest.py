import matplotlib.font_manager  # noqa: F401
import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))
# Imported above for its side effect: matplotlib builds its font cache on its first run on a
# machine and, when that takes over 5 s (a loaded machine), says so on stderr. Built here, it
# happens before any test reads what a command printed.


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


def pytest_collection_modifyitems(config, items):
    """GPU tests skip themselves on machines without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def linear_step_costs(monkeypatch):
    """ablation's cost-model steps 'timed' at a fixed linear cost. Timed for real, a busy
    machine can make every per-token cost come out negative and the fit refuse the run (a
    test that failed one run in several under load); the fit is tested on its own."""
    from benchbatch.probes import ablation
    from benchbatch.timing import Measurement

    def linear(model, step, opts, cuda_graphs=False, seed=0):
        decode, prefill, context = step.features
        return Measurement([1.0 + 0.05 * decode + 0.01 * prefill + 0.0005 * context])

    monkeypatch.setattr(ablation, "time_mixed", linear)

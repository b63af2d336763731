"""The flow's fit in NumPy (`flow_numpy`): the torch fit's steps, to float rounding (the same initial weights, the
same gradients and Adam step), a flow as good, and a fit on the CPU that never imports torch."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from retriever.calibration import flow_numpy, load_calibrator, make_calibrator
from retriever.calibration.flow import FlowCalibrator, share_one_buffer
from retriever.calibration.glow import Glow, Reduction
from retriever.errors import RetrieverError
from tests.test_flow import correlated_sample


@pytest.mark.parametrize("dim, levels, depth, width, seed", [(16, 2, 3, 32, 0), (9, 3, 2, 8, 7), (384, 2, 3, 32, 2)])
def test_the_initial_weights_are_torchs_to_the_last_bit(dim, levels, depth, width, seed):
    ours = flow_numpy.NumpyFlow(dim, levels, depth, width, seed)
    torchs = Glow(dim, levels, depth, width, "reverse", seed).state_dict()
    assert list(ours.parameters) == list(torchs)  # the torch module's names, in its order
    for name, tensor in torchs.items():
        assert np.array_equal(ours.parameters[name], tensor.numpy()), name


@pytest.mark.parametrize("dim, levels, depth, width, k, shift_penalty",
                         [(12, 2, 3, 16, 10, 1.0), (9, 3, 2, 8, None, 0.5), (7, 1, 4, 8, None, 0.0),
                          (13, 2, 1, 8, 13, 2.0)])
def test_a_step_computes_torchs_loss_and_gradients(dim, levels, depth, width, k, shift_penalty):
    X = correlated_sample(2000, dim)
    reduction = flow_numpy.reduction_arrays(X, k) if k is not None else None
    ours = flow_numpy.NumpyFlow(dim, levels, depth, width, 0, reduction)
    glow = Glow(dim, levels, depth, width, "reverse", 0, reduce_to=k)
    if reduction is not None:
        glow.reduction = Reduction(*(torch.from_numpy(array) for array in reduction))
    parameters = share_one_buffer(glow)
    ours.initialize(X[:32])
    glow.initialize(torch.from_numpy(X[:32]))
    for name, tensor in glow.state_dict().items():  # the data-dependent init, to its rounding
        np.testing.assert_allclose(ours.state_dict()[name], tensor.numpy(), rtol=1e-5, atol=1e-5)
    # Every weight random, the couplings' last layers too (zero at init, where their backward would go untested).
    ours.flat[:] = np.random.default_rng(1).normal(0, 0.3, len(ours.flat)).astype(np.float32)
    with torch.no_grad():
        parameters.copy_(torch.from_numpy(ours.flat))
    loss = ours.loss_and_gradients(X[32:64], shift_penalty)
    assert loss == pytest.approx(glow.loss_and_gradients(torch.from_numpy(X[32:64]), shift_penalty).item(),
                                 rel=1e-5)
    np.testing.assert_allclose(ours.grad, parameters.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert (ours.grad != 0).mean() > 0.5  # the couplings' layers carry gradient: their backward is compared


def test_adam_steps_as_torchs_fused_kernel():
    rng = np.random.default_rng(0)
    start = rng.normal(size=2000).astype(np.float32)
    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    theirs.grad = torch.zeros_like(theirs)
    ours = start.copy()
    our_adam, their_adam = flow_numpy.Adam(ours, 3e-3), torch.optim.Adam([theirs], lr=3e-3, fused=True)
    for _ in range(30):
        grad = (rng.normal(size=2000) * 10.0 ** rng.uniform(-6, 0, 2000)).astype(np.float32)
        theirs.grad.copy_(torch.from_numpy(grad))
        their_adam.step()
        our_adam.step(grad)
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-5, atol=1e-7)


def test_a_numpy_fit_follows_the_torch_fit_and_is_as_good():
    """Step for step the same losses until float rounding, amplified as training does any perturbation, parts them;
    held-out likelihood as high (each within what another seed gives)."""
    X = correlated_sample(6000, 16)
    train, held_out = X[:5000], X[5000:]
    ours = FlowCalibrator(seed=0, device="cpu").fit(train)
    torchs = FlowCalibrator(seed=0, device="cpu")
    torchs.trainer = "torch"
    torchs.fit(train)
    assert ours.fit_path == "numpy" and torchs.fit_path == "eager"
    np.testing.assert_allclose(ours.losses[:10], torchs.losses[:10], rtol=0, atol=1e-3)
    other_seed = FlowCalibrator(seed=1, device="cpu").fit(train)
    ours_nll, torchs_nll, seeds_nll = (-calibrator.log_prob(held_out).mean() for calibrator in (ours, torchs,
                                                                                                 other_seed))
    assert abs(ours_nll - torchs_nll) < max(0.05, 2 * abs(seeds_nll - ours_nll))


def test_only_the_default_shape_surely_on_the_cpu_fits_in_numpy(monkeypatch):
    import retriever.calibration.flow as flow_module

    X = correlated_sample(1500, 10)
    assert make_calibrator("flow-6", device="cpu", width=8).fit(X).fit_path == "numpy"
    assert make_calibrator("flow", device="cpu", width=8, mixing="lu").fit(X).fit_path == "eager"
    assert make_calibrator("flow", device="cpu", width=8, permutation="random").fit(X).fit_path == "eager"
    refused = make_calibrator("flow", device="cpu", width=8)
    refused.trainer = "numpy"
    with pytest.raises(RetrieverError, match="flow trainer must be one of auto, torch"):
        refused.fit(X)
    # Where torch must say whether a GPU is there (auto on a machine that may have one), torch fits.
    monkeypatch.setattr(flow_module, "surely_cpu", lambda device: False)
    assert make_calibrator("flow", device="auto", width=8).fit(X).fit_path in ("eager", "cuda-graph")


def test_a_fit_saved_and_loaded_on_the_cpu_never_imports_torch(tmp_path):
    script = ("import sys, numpy as np; from retriever.calibration import make_calibrator, load_calibrator; "
              "X = np.random.default_rng(0).normal(size=(400, 8)).astype(np.float32); "
              f"flow = make_calibrator('flow', device='cpu').fit(X); flow.save({str(tmp_path)!r}); "
              f"again = load_calibrator({str(tmp_path)!r}, expected_dim=8); "
              "assert np.array_equal(again.transform(X), flow.transform(X)); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    # Its torch module, made where it is wanted, maps as its NumPy map does, and inverts it.
    loaded = load_calibrator(tmp_path, expected_dim=8)
    X = np.random.default_rng(0).normal(size=(400, 8)).astype(np.float32)
    with torch.inference_mode():
        np.testing.assert_allclose(loaded.torch_module()(torch.from_numpy(X))[0].numpy(), loaded.transform(X),
                                   rtol=0, atol=1e-5)
    np.testing.assert_allclose(loaded.inverse(loaded.transform(X)), X, rtol=0, atol=1e-4)

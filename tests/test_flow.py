"""The BERT-flow calibrator: exact invertibility and log-determinants, a proper density, Gaussianization of a
correlated sample, determinism, persistence and memmap streaming."""

import copy

import numpy as np
import pytest
import torch
from scipy.stats import norm

from retriever.calibration import base, load_calibrator, make_calibrator
from retriever.calibration.flow import FlowCalibrator, share_one_buffer
from retriever.calibration.glow import ActNorm, AdditiveCoupling, Glow, LUMixing, Permutation, Reduction, Reverse
from retriever.errors import RetrieverError


def correlated_sample(n: int, dim: int, rho: float = 0.9, seed: int = 0) -> np.ndarray:
    """Equicorrelated Gaussian (correlation rho between every pair), random scales 0.5-3, means around 5."""
    rng = np.random.default_rng(seed)
    cholesky = np.linalg.cholesky(np.full((dim, dim), rho) + (1 - rho) * np.eye(dim))
    scales = rng.uniform(0.5, 3.0, dim)
    return ((rng.normal(size=(n, dim)) @ cholesky.T) * scales + rng.normal(5.0, 2.0, dim)).astype(np.float32)


def randomized_glow(dim: int, seed: int = 0, scale: float = 0.3, **options) -> Glow:
    """A float64 Glow with every parameter random, so that no transform is the identity."""
    flow = Glow(dim, seed=seed, **options).double()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in flow.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * scale)
    return flow


def jacobian_logdet(function, x: torch.Tensor) -> float:
    jacobian = torch.autograd.functional.jacobian(lambda v: function(v[None])[0], x)
    sign, logabsdet = torch.linalg.slogdet(jacobian)
    assert sign != 0
    return logabsdet.item()


@pytest.mark.parametrize(
    "transform",
    [ActNorm(7), Reverse(), Permutation(torch.tensor([3, 0, 6, 1, 5, 2, 4])),
     AdditiveCoupling(7, width=5), LUMixing(7)],
    ids=["actnorm", "reverse", "random-permutation", "coupling", "lu-mixing"],
)
def test_each_transform_inverts_and_reports_its_logdet(transform):
    transform = transform.double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in transform.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    x = torch.randn(5, 7, generator=generator, dtype=torch.float64)
    y, logdet = transform(x)
    assert torch.allclose(transform.inverse(y), x, atol=1e-12)
    for row in range(3):
        assert logdet[row].item() == pytest.approx(jacobian_logdet(lambda v: transform(v)[0], x[row]), abs=1e-9)


@pytest.mark.parametrize("dim", [6, 7])
@pytest.mark.parametrize("permutation, mixing", [("reverse", "none"), ("random", "none"), ("reverse", "lu")])
def test_glow_logdet_equals_autograd_jacobian(dim, permutation, mixing):
    flow = randomized_glow(dim, permutation=permutation, width=8, mixing=mixing)
    x = torch.randn(4, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    z, logdet = flow(x)
    assert z.shape == (4, dim)
    for row in range(4):
        assert logdet[row].item() == pytest.approx(jacobian_logdet(lambda v: flow(v)[0], x[row]), abs=1e-9)
    assert torch.allclose(flow.inverse(z), x, atol=1e-10)


@pytest.mark.parametrize("dim, levels, permutation, n, mixing, reduce_to",
                         [(12, 2, "reverse", 40, "none", None), (7, 2, "random", 40, "none", None),
                          (9, 3, "reverse", 40, "none", None), (5, 1, "random", 40, "none", None),
                          (8, 2, "reverse", 1, "none", None), (9, 2, "reverse", 40, "lu", None),
                          (12, 2, "random", 40, "lu", 8)])
def test_hand_derived_gradients_equal_autograd(dim, levels, permutation, n, mixing, reduce_to):
    flow = randomized_glow(dim, levels=levels, permutation=permutation, width=8, mixing=mixing, reduce_to=reduce_to)
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2 + 1
    if reduce_to is not None:
        flow.reduction = Reduction.fit(x.numpy(), reduce_to).double()
    reference = copy.deepcopy(flow)
    expected_loss = reference.loss(x, shift_penalty=0.7)
    expected_loss.backward()
    # As in training: every parameter and its .grad are views of one flat buffer, here pre-filled with NaN so a
    # gradient that is not written (or accumulated instead of overwritten) shows.
    flat = share_one_buffer(flow)
    flat.grad.fill_(float("nan"))
    loss = flow.loss_and_gradients(x, shift_penalty=0.7)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-12)
    for (name, parameter), expected in zip(flow.named_parameters(), reference.parameters()):
        assert torch.allclose(parameter.grad, expected.grad, rtol=1e-9, atol=1e-12), name


def test_hand_derived_gradients_need_existing_grads():
    flow = Glow(6, width=4)
    with pytest.raises(RuntimeError, match="existing .grad"):
        flow.loss_and_gradients(torch.randn(8, 6), shift_penalty=1.0)


def on_torch(calibrator: FlowCalibrator) -> FlowCalibrator:
    """CALIBRATOR set to fit on torch (a CPU fit of the default shape is NumPy's, `flow_numpy`)."""
    calibrator.trainer = "torch"
    return calibrator


def test_fit_gives_every_parameter_its_own_storage_back():
    # Training on torch views all parameters as one flat buffer; afterwards none may alias another or keep a gradient.
    flow = on_torch(make_calibrator("flow", device="cpu", epochs=1)).fit(correlated_sample(200, 16))
    parameters = list(flow.flow.parameters())
    assert all(parameter.grad is None for parameter in parameters)
    assert len({parameter.untyped_storage().data_ptr() for parameter in parameters}) == len(parameters)


def test_log_prob_is_a_normalized_density():
    # Integrate exp(log_prob) over a fine 2-D grid: a correct change of variables gives total mass 1.
    flow = randomized_glow(2, seed=1, levels=1, depth=3, width=8, scale=0.4)
    with torch.no_grad():  # moderate ActNorm scales keep the mass well inside the grid
        for module in flow.modules():
            if isinstance(module, ActNorm):
                module.scaled_log_scale.mul_(0.2)
    samples = flow.inverse(torch.randn(20000, 2, dtype=torch.float64)).detach()
    assert samples.abs().max() < 9 and samples.std(0).min() > 0.5  # the grid below covers the mass, finely enough
    axis = torch.linspace(-12, 12, 801, dtype=torch.float64)
    grid = torch.cartesian_prod(axis, axis)
    with torch.no_grad():
        density = flow.log_prob(grid).exp()
    mass = density.sum().item() * (axis[1] - axis[0]).item() ** 2
    assert mass == pytest.approx(1.0, abs=2e-3)


def test_untrained_flow_is_the_diagonal_gaussian_of_its_init_batch():
    # Zero-initialised couplings: the flow is ActNorm only, so log_prob is the per-dimension normal density with
    # the first batch's mean and std (the first ActNorm standardizes, the later ones see mean 0, std 1).
    x = torch.from_numpy(correlated_sample(64, 6)).double()
    flow = Glow(6).double()
    flow.initialize(x)
    mean, std = x.mean(0).numpy(), x.std(0, unbiased=False).numpy()
    expected = norm.logpdf(x.numpy(), mean, std + 1e-6).sum(1)
    assert np.allclose(flow.log_prob(x).detach().numpy(), expected, atol=1e-4)


@pytest.fixture(scope="module")
def correlated_fit():
    """An 8-dim strongly correlated, shifted sample, and the pure maximum-likelihood flow fitted on it."""
    X = correlated_sample(10000, 8)
    flow = make_calibrator("flow", device="cpu", epochs=4, shift_penalty=0.0, seed=0).fit(X[:8000])
    return X[:8000], X[8000:], flow


def test_flow_gaussianizes_a_correlated_shifted_sample(correlated_fit):
    X, held_out, flow = correlated_fit
    off_diagonal = ~np.eye(8, dtype=bool)
    assert np.corrcoef(X.T)[off_diagonal].min() > 0.85 and np.abs(X.mean(0)).min() > 1  # the task is not trivial
    Z = flow.transform(X)
    assert Z.dtype == np.float32 and Z.shape == X.shape
    Z = Z.astype(np.float64)
    # 4 epochs of additive couplings leave some correlation; measured: |mean| <= 0.13, |cov - I| <= 0.11.
    assert np.abs(Z.mean(0)).max() < 0.25
    assert np.abs(np.cov(Z.T) - np.eye(8)).max() < 0.25
    # Training raised the likelihood of held-out vectors well above that of the init (a diagonal Gaussian).
    untrained = Glow(8)
    untrained.initialize(torch.from_numpy(X[:32]))
    with torch.no_grad():
        untrained_log_prob = untrained.log_prob(torch.from_numpy(held_out)).mean().item()
    assert flow.log_prob(held_out).mean() > untrained_log_prob + 2.0


def test_inverse_of_transform_recovers_the_input(correlated_fit):
    X, _, flow = correlated_fit
    assert np.abs(flow.inverse(flow.transform(X)) - X).max() <= 1e-4


def test_shift_penalty_shortens_the_transport(correlated_fit):
    X, _, mle_flow = correlated_fit
    penalized = make_calibrator("flow", device="cpu", epochs=4, shift_penalty=1.0, seed=0).fit(X)

    def mean_transport(calibrator):
        with torch.no_grad():
            return calibrator.torch_module().transport(torch.from_numpy(X)).mean().item()

    assert mean_transport(penalized) < 0.2 * mean_transport(mle_flow)  # measured: 0.53 vs 15.5


def test_same_seed_gives_identical_flows_and_another_seed_does_not():
    X = correlated_sample(1500, 10)
    first = make_calibrator("flow", device="cpu", seed=3, epochs=1).fit(X).transform(X)
    second = make_calibrator("flow", device="cpu", seed=3, epochs=1).fit(X).transform(X)
    other = make_calibrator("flow", device="cpu", seed=4, epochs=1).fit(X).transform(X)
    assert np.array_equal(first, second)
    assert not np.allclose(first, other, atol=1e-3)


def test_a_cpu_fit_steps_as_torchs_fused_adam_to_the_last_bit_without_importing_dynamo(monkeypatch):
    """The flow's own Adam step on the CPU (`flow._FusedAdam`) is torch.optim.Adam(fused=True)'s: the same losses and
    weights bit for bit; and a fit in a fresh process never imports torch._dynamo (a second of a small build)."""
    import subprocess
    import sys

    import retriever.calibration.flow as flow_module

    X = correlated_sample(600, 8)
    ours = on_torch(FlowCalibrator(epochs=2, seed=3)).fit(X)
    monkeypatch.setattr(flow_module, "_adam",
                        lambda parameters, lr, capturable=False: torch.optim.Adam(list(parameters), lr=lr, fused=True))
    torchs = on_torch(FlowCalibrator(epochs=2, seed=3)).fit(X)
    assert ours.losses == torchs.losses
    for a, b in zip(ours.flow.state_dict().values(), torchs.flow.state_dict().values()):
        assert torch.equal(a, b)
    # Before torch 2.4 the fused kernel is CUDA's alone: the optimizer class decides there.
    monkeypatch.setattr(torch, "__version__", "2.3.1+cpu")
    assert not flow_module._fused_adam_on_cpu()
    monkeypatch.setattr(torch, "__version__", "2.4.0")
    assert flow_module._fused_adam_on_cpu()
    script = ("import sys, numpy as np; from retriever.calibration.flow import FlowCalibrator; "
              "flow = FlowCalibrator(epochs=1); flow.trainer = 'torch'; "
              "flow.fit(np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)); "
              "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_save_and_load_give_identical_output(tmp_path):
    X = correlated_sample(1500, 10)
    flow = make_calibrator("flow", device="cpu", epochs=1, permutation="random", width=16).fit(X)
    flow.save(tmp_path)
    assert (tmp_path / "calibrator.json").is_file() and (tmp_path / "flow.npz").is_file()
    loaded = load_calibrator(tmp_path, expected_dim=10)
    assert isinstance(loaded, FlowCalibrator) and loaded.config() == flow.config()
    assert np.array_equal(loaded.transform(X), flow.transform(X))
    assert np.array_equal(loaded.log_prob(X), flow.log_prob(X))


@pytest.mark.parametrize("options", [{}, {"k": 6}, {"mixing": "lu"}, {"permutation": "random", "levels": 3}])
def test_vectors_are_calibrated_in_numpy_as_the_torch_module_maps_them(options):
    X = correlated_sample(1500, 10)
    flow = make_calibrator("flow", device="cpu", width=16, **options).fit(X)
    with torch.inference_mode():
        expected = flow.torch_module()(torch.from_numpy(X))[0].numpy()
    np.testing.assert_allclose(flow.transform(X), expected, rtol=0, atol=2e-5)
    for row in (0, 700, 1499):  # a query alone, as a search calibrates it, is calibrated as in a build's batch
        np.testing.assert_allclose(flow.transform(X[row : row + 1])[0], flow.transform(X)[row], rtol=0, atol=1e-5)
    np.testing.assert_allclose(flow.inverse(flow.transform(X[:50])), X[:50] if "k" not in options else
                               flow.inverse(expected[:50]), rtol=0, atol=2e-3)


def test_a_loaded_flow_calibrates_without_importing_torch(tmp_path):
    import subprocess
    import sys

    X = correlated_sample(1500, 10)
    flow = make_calibrator("flow-6+lu", device="cpu", width=16).fit(X)
    flow.save(tmp_path)
    np.save(tmp_path / "x.npy", X[:20])
    script = ("import sys, numpy as np; from retriever.calibration import load_calibrator; "
              f"folder = {str(tmp_path)!r}; z = load_calibrator(folder, expected_dim=10).transform("
              "np.load(folder + '/x.npy')); np.save(folder + '/z.npy', z); print('torch' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "False"
    assert np.array_equal(np.load(tmp_path / "z.npy"), flow.transform(X[:20]))


def test_a_flow_loaded_with_its_map_inverts_and_scores_densities_after_its_folder_is_gone(tmp_path):
    import shutil

    X = correlated_sample(1500, 10)
    flow = make_calibrator("flow", device="cpu", width=16).fit(X)
    flow.save(tmp_path / "first")
    loaded = load_calibrator(tmp_path / "first", expected_dim=10)
    shutil.rmtree(tmp_path / "first")  # a later write pruned the version it was read from
    loaded.save(tmp_path / "second")
    again = load_calibrator(tmp_path / "second", expected_dim=10)
    assert (tmp_path / "second" / "flow.npz").read_bytes() and again.flow is None  # the torch module not read yet
    assert np.array_equal(again.transform(X), flow.transform(X))
    assert np.array_equal(again.log_prob(X), flow.log_prob(X))
    Z = flow.transform(X[:20])
    assert np.array_equal(again.inverse(Z), flow.inverse(Z))


def test_weights_other_than_those_its_map_was_read_from_are_refused(tmp_path):
    X = correlated_sample(1500, 10)
    make_calibrator("flow", device="cpu", width=16, seed=0).fit(X).save(tmp_path / "one")
    make_calibrator("flow", device="cpu", width=16, seed=1).fit(X).save(tmp_path / "other")
    (tmp_path / "one" / "flow.npz").write_bytes((tmp_path / "other" / "flow.npz").read_bytes())
    with pytest.raises(RetrieverError, match="its map was read from other weights"):
        load_calibrator(tmp_path / "one", expected_dim=10)


@pytest.mark.parametrize("damaged", ["flow-forward.npz", "flow.npz", "flow.pt", "flow.npz: one array",
                                     "flow.pt: one tensor"])
def test_a_damaged_map_or_weights_file_is_one_clear_error(tmp_path, damaged):
    flow = make_calibrator("flow", device="cpu", width=16).fit(correlated_sample(1500, 10))
    flow.save(tmp_path)
    name, _, how = damaged.partition(": ")
    if name == "flow.pt":  # a flow saved before flow.npz: torch.save's weights
        torch.save(flow.torch_module().state_dict(), tmp_path / "flow.pt")
        (tmp_path / "flow.npz").unlink()
    if name != "flow-forward.npz":  # the weights are read only where there is no map
        (tmp_path / "flow-forward.npz").unlink()
    path = tmp_path / name
    if how == "one array":
        np.save(path.with_suffix(".npy"), np.ones(3))
        path.write_bytes(path.with_suffix(".npy").read_bytes())
    elif how == "one tensor":
        torch.save(torch.ones(3), path)
    else:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(RetrieverError, match="is not a flow's saved map|does not match the flow described"):
        load_calibrator(tmp_path, expected_dim=10)


def save_as_before_flow_npz(flow: FlowCalibrator, folder) -> None:
    """FLOW saved as the versions between its NumPy map and flow.npz saved one: torch.save's flow.pt beside the map,
    which names its sha256."""
    import hashlib
    import io

    from retriever.calibration.flow import FORWARD_FILE

    flow.save(folder)
    buffer = io.BytesIO()
    torch.save(flow.torch_module().state_dict(), buffer)
    (folder / "flow.npz").unlink()
    (folder / "flow.pt").write_bytes(buffer.getvalue())
    flow.forward.weights_digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    flow.forward.save(folder / FORWARD_FILE)


def test_a_failed_refit_leaves_the_flow_fitted_before_whole(tmp_path):
    X = correlated_sample(1500, 16)
    flow = make_calibrator("flow", device="cpu", width=16, levels=4).fit(X)
    before = flow.transform(X[:5])
    with pytest.raises(RetrieverError, match="at least 16 dimensions"):
        flow.fit(X[:, :8])
    flow.save(tmp_path)  # still whole: saved and read back as it was
    np.testing.assert_array_equal(load_calibrator(tmp_path, expected_dim=16).transform(X[:5]), before)
    assert np.isfinite(flow.log_prob(X[:5])).all()


def test_a_folder_saved_into_again_keeps_one_weights_file(tmp_path):
    """A flow read from torch.save's flow.pt beside its map saves under that name again; saved into a folder that
    holds a flow.npz of another flow, it leaves no stale file to be read instead."""
    X = correlated_sample(1500, 10)
    old = make_calibrator("flow", device="cpu", width=16, seed=1).fit(X)
    save_as_before_flow_npz(old, tmp_path / "old")
    make_calibrator("flow", device="cpu", width=16, seed=2).fit(X).save(tmp_path / "reused")
    load_calibrator(tmp_path / "old", expected_dim=10).save(tmp_path / "reused")
    assert not (tmp_path / "reused" / "flow.npz").exists()
    np.testing.assert_array_equal(load_calibrator(tmp_path / "reused", expected_dim=10).transform(X), old.transform(X))


def test_a_flow_saved_before_its_numpy_map_loads_through_torch_with_the_same_vectors(tmp_path):
    X = correlated_sample(1500, 10)
    flow = make_calibrator("flow", device="cpu", width=16).fit(X)
    flow.save(tmp_path)
    # what a flow saved by an earlier version holds: its torch weights alone, as torch.save wrote them
    torch.save(flow.torch_module().state_dict(), tmp_path / "flow.pt")
    (tmp_path / "flow-forward.npz").unlink()
    (tmp_path / "flow.npz").unlink()
    loaded = load_calibrator(tmp_path, expected_dim=10)
    np.testing.assert_allclose(loaded.transform(X), flow.transform(X), rtol=0, atol=1e-5)  # torch's exp, NumPy's
    loaded.save(tmp_path / "again")  # saved again (a copy of an index), it gains its map
    assert np.array_equal(load_calibrator(tmp_path / "again", expected_dim=10).transform(X), loaded.transform(X))


def test_a_flow_saved_with_torch_weights_and_its_map_loads_and_saves_again_as_it_was(tmp_path):
    """The indexes of the versions between the map and the NumPy fit: torch.save's flow.pt beside the map."""
    from retriever.calibration.flow import FORWARD_FILE

    X = correlated_sample(1500, 10)
    flow = make_calibrator("flow", device="cpu", width=16).fit(X)
    save_as_before_flow_npz(flow, tmp_path / "old")
    loaded = load_calibrator(tmp_path / "old", expected_dim=10)
    assert np.array_equal(loaded.transform(X), flow.transform(X)) and loaded.flow is None
    loaded.save(tmp_path / "copy")  # a write's new version: the same files
    for name in ("flow.pt", FORWARD_FILE):
        assert (tmp_path / "copy" / name).read_bytes() == (tmp_path / "old" / name).read_bytes()
    again = load_calibrator(tmp_path / "copy", expected_dim=10)
    assert np.array_equal(again.log_prob(X[:5]), flow.log_prob(X[:5]))


@pytest.mark.parametrize("dim, levels", [(7, 2), (9, 3), (5, 1)])
def test_odd_dimensions(dim, levels):
    X = correlated_sample(1000, dim)
    flow = make_calibrator("flow", device="cpu", epochs=1, levels=levels).fit(X)
    Z = flow.transform(X)
    assert Z.shape == (1000, dim) and Z.dtype == np.float32 and np.isfinite(Z).all()
    assert np.abs(flow.inverse(Z) - X).max() <= 1e-4


def test_near_constant_dimensions_train_without_overflow():
    # MiniLM's last layer has dimensions that are ~0 everywhere. Glow's 1/(std + 1e-6) init scales such a dimension
    # by 1e6 at every ActNorm it crosses (measured here: losses of 1e17 and more); it must keep scale 1 instead.
    X = correlated_sample(2000, 8)
    X[:, 6] = 1e-12 * np.random.default_rng(0).normal(size=2000)  # index 6 stays in the flow through both levels
    X[:, 1] = 3.0
    flow = make_calibrator("flow", device="cpu", epochs=1).fit(X)
    assert np.isfinite(flow.losses).all() and max(flow.losses) < 10
    assert np.mean(flow.losses[-6:]) < np.mean(flow.losses[:6]) - 0.2  # and it still learns
    assert np.isfinite(flow.transform(X)).all()


class RowSpy:
    """Array stand-in that records the most rows handed out by a single read."""

    def __init__(self, array):
        self.array, self.most_rows = array, 0
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim

    def __getitem__(self, index):
        rows = self.array[index]
        self.most_rows = max(self.most_rows, len(rows))
        return rows


def test_fits_from_a_memmap_batch_by_batch(tmp_path, monkeypatch):
    X = correlated_sample(3000, 12)
    np.save(tmp_path / "vectors.npy", X)
    monkeypatch.setattr(base, "CHUNK_ROWS", 256)  # input checks stream in chunks of this size
    spy = RowSpy(np.load(tmp_path / "vectors.npy", mmap_mode="r"))
    from_memmap = make_calibrator("flow", device="cpu", epochs=1).fit(spy)
    assert spy.most_rows <= 256
    from_array = make_calibrator("flow", device="cpu", epochs=1).fit(X)
    assert np.array_equal(from_memmap.transform(X), from_array.transform(X))


@pytest.mark.parametrize(
    "options",
    [{"levels": 0}, {"depth": -1}, {"width": 2.5}, {"batch_size": 0}, {"epochs": True}, {"lr": 0},
     {"shift_penalty": -1}, {"permutation": "sideways"}, {"seed": -1}, {"seed": 2**64}],
)
def test_bad_flow_options_are_refused(options):
    with pytest.raises(RetrieverError, match="flow option"):
        make_calibrator("flow", **options)


def test_too_few_dimensions_for_the_levels():
    with pytest.raises(RetrieverError, match="at least 4 dimensions"):
        make_calibrator("flow", levels=2).fit(np.ones((10, 3), dtype=np.float32))


def test_lu_mixing_starts_as_the_identity_and_learns():
    X = correlated_sample(3000, 12)
    plain = make_calibrator("flow", device="cpu", width=16)
    mixed = make_calibrator("flow", device="cpu", width=16, mixing="lu")
    untrained_plain, untrained_mixed = plain._new_flow(12), mixed._new_flow(12)
    x = torch.from_numpy(X[:64])
    untrained_plain.initialize(x), untrained_mixed.initialize(x)
    assert torch.allclose(untrained_plain(x)[0], untrained_mixed(x)[0], atol=1e-6)  # identity at start
    mixed.fit(X)
    weights = [m.weight() for m in mixed.flow.modules() if isinstance(m, LUMixing)]
    assert len(weights) == 6 and all(not torch.allclose(w, torch.eye(len(w))) for w in weights)
    Z = mixed.transform(X)
    assert np.abs(mixed.inverse(Z) - X).max() <= 1e-3
    assert mixed.config()["mixing"] == "lu" and "mixing" not in plain.config()


def test_flow_k_whitens_to_k_directions_then_flows(tmp_path):
    X = correlated_sample(3000, 16)
    flow = make_calibrator("flow-8", device="cpu", width=16).fit(X)
    assert flow.name == "flow-8" and flow.config()["k"] == 8
    Z = flow.transform(X)
    assert Z.shape == (3000, 8) and np.isfinite(Z).all()
    assert np.abs(np.corrcoef(Z.T) - np.eye(8)).max() < 0.15  # decorrelated, as the Gaussian it fits
    # The kept subspace goes back exactly: X projected on its top 8 principal directions.
    centered = X - X.mean(0)
    top = np.linalg.svd(centered, full_matrices=False)[2][:8]
    projected = centered @ top.T @ top + X.mean(0)
    assert np.abs(flow.inverse(Z) - projected).max() < 1e-2
    flow.save(tmp_path)
    loaded = load_calibrator(tmp_path, expected_dim=16)
    assert loaded.name == "flow-8" and np.array_equal(loaded.transform(X), Z)
    assert np.array_equal(loaded.log_prob(X), flow.log_prob(X))


def test_flow_k_log_prob_is_the_density_of_the_kept_directions():
    # With K = dim the reduction is invertible: log p(x) must integrate like a density on R^dim, i.e. equal the
    # Gaussian log-density of z plus the log-determinants (checked against autograd's Jacobian).
    X = correlated_sample(2000, 6)
    flow = make_calibrator("flow-6", device="cpu", width=8).fit(X)
    glow = flow.torch_module().double()
    x = torch.from_numpy(X[:3]).double()
    z, logdet = glow(x)
    for row in range(3):
        assert logdet[row].item() == pytest.approx(jacobian_logdet(lambda v: glow(v)[0], x[row]), abs=1e-6)


def test_flow_k_names_and_limits():
    assert make_calibrator("flow-256").k == 256 and make_calibrator("FLOW").k is None
    assert make_calibrator("flow-8").min_fit_rows(16) == 9
    with pytest.raises(RetrieverError, match="K <= the vector dimension"):
        make_calibrator("flow-32").fit(correlated_sample(100, 16))
    with pytest.raises(RetrieverError, match="a flow keeps at least 4 dimensions \\(flow-K with K of at least 4"):
        make_calibrator("flow-2")
    with pytest.raises(RetrieverError, match="flow option mixing"):
        make_calibrator("flow", mixing="conv")


def test_too_few_vectors_for_the_flow_suggest_a_flow_k_that_fits():
    from retriever.calibration import make_calibrator, too_few_to_fit
    from retriever.errors import RetrieverError

    why = RetrieverError(too_few_to_fit(make_calibrator("flow"), 60, 384))
    assert "at least 385" in str(why) and "try --calibrator flow-32" in why.render({"calibrator": "--calibrator"})
    assert str(RetrieverError(too_few_to_fit(make_calibrator("flow"), 3, 384))) == (
        "too few to fit the flow (it needs at least 385 for 384 dimensions)")
    assert too_few_to_fit(make_calibrator("flow"), 400, 384) is None


def test_flow_k_names_its_first_stage_when_whitening_warns():
    X = np.random.default_rng(0).standard_normal((20, 32)).astype(np.float32)
    with pytest.warns(UserWarning, match=r"^flow-8's first stage, whitening fitted on 20 vectors of dimension 32"):
        FlowCalibrator(k=8, device="cpu").fit(X)

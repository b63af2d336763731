"""A flow's fit in NumPy, on the CPU: the Glow of `glow` in its default shape (the reverse permutation, no LU
mixing, optionally after a whitening to K dimensions), trained as `flow.FlowCalibrator` trains the torch module,
step for step: the same initial weights (torch's seeded `nn.Linear` init, drawn here from the same Mersenne Twister
stream), the same batches, the same hand-written gradients (`glow.Glow.loss_and_gradients`), gradient clipping and
Adam step (the arithmetic of torch's fused kernel), in float32. Each step computes what torch's does to float
rounding (tests); over a fit, training amplifies that rounding as it amplifies any (torch on vectors one unit in the
last place apart parts from itself as far), and the flows are as good, seed for seed
(benchmarks/results/flow_trainers.md). A build on the CPU then never imports torch: about a second of every process
that fits a flow.

At batch 32 a step is a few hundred operations on arrays of a few thousand numbers: what each costs is the call,
and NumPy's call costs a fraction of torch's.

The parameters live in one float32 buffer (and their gradients in another), each a view named as in the torch
module's state dict, in its order: what `state_dict` hands the torch module when one is wanted (`inverse`,
`log_prob`), and what the flow's weights file holds.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from retriever.calibration.flow_forward import FlowForward, level_dims
from retriever.errors import RetrieverError

# As `glow`: actnorm log-scales are stored divided by LOGSCALE_FACTOR; an input dimension whose std on the init batch
# is at most CONSTANT_STD of the largest keeps scale 1.
LOGSCALE_FACTOR = 3.0
CONSTANT_STD = 1e-6
_LOG_2PI = math.log(2 * math.pi)
# torch.optim.Adam's defaults, which the torch fit uses.
BETAS = (0.9, 0.999)
EPS = 1e-8
MAX_GRAD_NORM = 1.0


def fits_in_numpy(permutation: str, mixing: str) -> bool:
    """Whether a flow of these options trains here (the default shape); others train on torch."""
    return permutation == "reverse" and mixing == "none"


def check_levels(dim: int, levels: int) -> None:
    """Refuse a flow of LEVELS levels on DIM dimensions: each level but the last halves them."""
    if dim < 2 ** levels:
        raise RetrieverError(f"a {levels}-level flow needs vectors of at least {2 ** levels} dimensions (got {dim})")


def reduction_arrays(X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """flow-K's first stage (`glow.Reduction`): `whitening-K` fitted on X, as (mean, W (dim, K), its pseudo-inverse
    (K, dim)), float32. A warning of the fit is said as what it is here: flow-K's first stage."""
    from retriever.calibration.linear import Whitening

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        whitening = Whitening(k).fit(X)
    for warning in caught:
        warnings.warn(f"flow-{k}'s first stage, {warning.message}", warning.category, stacklevel=4)
    # W = U_k diag(w) with U orthonormal: its pseudo-inverse is diag(1 / w^2) W^T.
    inverse_weight = whitening.W.T / np.square(whitening.W).sum(0)[:, None]
    return tuple(np.ascontiguousarray(a, dtype=np.float32) for a in (whitening.mean, whitening.W, inverse_weight))


class NumpyFlow:
    """The default-shaped Glow on DIM-dimensional vectors (K after REDUCTION, (mean, W, pseudo-inverse), when
    given), its weights initialised as `glow.Glow(dim, levels, depth, width, "reverse", seed)` initialises them."""

    def __init__(self, dim: int, levels: int, depth: int, width: int, seed: int,
                 reduction: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.reduction = reduction
        self.dim = reduction[1].shape[1] if reduction is not None else dim
        check_levels(self.dim, levels)
        self.level_dims = level_dims(self.dim, levels)
        self.depth, self.width = depth, width
        shapes: dict[str, tuple[int, ...]] = {}
        for index, level_dim in enumerate(self.level_dims):
            split = level_dim // 2
            for step in range(depth):
                actnorm, coupling = f"levels.{index}.{3 * step}", f"levels.{index}.{3 * step + 2}.shift"
                shapes.update({f"{actnorm}.bias": (level_dim,), f"{actnorm}.scaled_log_scale": (level_dim,),
                               f"{coupling}.0.weight": (width, split), f"{coupling}.0.bias": (width,),
                               f"{coupling}.2.weight": (width, width), f"{coupling}.2.bias": (width,),
                               f"{coupling}.4.weight": (level_dim - split, width),
                               f"{coupling}.4.bias": (level_dim - split,)})
        self.flat = np.zeros(sum(math.prod(shape) for shape in shapes.values()), np.float32)
        self.grad = np.zeros_like(self.flat)
        self.parameters, self.gradients, offset = {}, {}, 0
        for name, shape in shapes.items():
            size = math.prod(shape)
            self.parameters[name] = self.flat[offset : offset + size].reshape(shape)
            self.gradients[name] = self.grad[offset : offset + size].reshape(shape)
            offset += size
        self._initialize_couplings(seed)
        # (actnorm, coupling) parameter names of each step, level by level
        self.steps = [[(f"levels.{index}.{3 * step}", f"levels.{index}.{3 * step + 2}.shift") for step in range(depth)]
                      for index in range(levels)]
        self.reduction_logdet = (np.float32(0.0) if reduction is None else
                                 np.float32(-0.5 * np.log(np.reciprocal(np.square(reduction[1]).sum(0))).sum()))

    def _initialize_couplings(self, seed: int) -> None:
        """Each coupling's linear layers as `nn.Linear` initialises them under `torch.manual_seed(seed)`: uniform
        draws (kaiming, a = sqrt(5): bound 1 / sqrt(fan_in)) from the Mersenne Twister seeded with SEED, one 32-bit
        output per number, in the order the torch module makes them (its last layer first, drawn and then zeroed,
        so the untrained coupling is the identity)."""
        stream = np.random.MT19937()
        stream._legacy_seeding(int(seed) & 0xFFFFFFFF)  # MT19937's own seeding (init_genrand), as torch seeds it
        gain = math.sqrt(2.0 / (1 + math.sqrt(5) ** 2))
        for index, level_dim in enumerate(self.level_dims):
            for step in range(self.depth):
                coupling = f"levels.{index}.{3 * step + 2}.shift"
                for layer in (4, 0, 2):
                    weight = self.parameters[f"{coupling}.{layer}.weight"]
                    fan_in = weight.shape[1]
                    weight[...] = _uniform(stream, weight.shape, math.sqrt(3.0) * gain / math.sqrt(fan_in))
                    self.parameters[f"{coupling}.{layer}.bias"][...] = _uniform(stream, (weight.shape[0],),
                                                                                1 / math.sqrt(fan_in))
                self.parameters[f"{coupling}.4.weight"][...] = 0
                self.parameters[f"{coupling}.4.bias"][...] = 0

    def reduce(self, x: np.ndarray) -> np.ndarray:
        if self.reduction is None:
            return x
        mean, weight, _ = self.reduction
        return (x - mean) @ weight

    def initialize(self, x: np.ndarray) -> None:
        """Data-dependent init (`glow.Glow.initialize`): each ActNorm gets mean 0, std 1 on this batch as it
        arrives through the flow."""
        x = self.reduce(x)
        for index, level in enumerate(self.steps):
            for actnorm, coupling in level:
                mean = x.mean(0)
                std = np.sqrt(np.square(x - mean).mean(0))
                log_scale = -np.log(std + np.float32(1e-6))
                constant = std <= CONSTANT_STD * std.max()
                self.parameters[f"{actnorm}.bias"][...] = -mean
                self.parameters[f"{actnorm}.scaled_log_scale"][...] = np.where(constant, 0, log_scale) / LOGSCALE_FACTOR
                x = self._coupling(coupling, self._actnorm(actnorm, x)[0][:, ::-1])[0]
            if index < len(self.steps) - 1:
                x = x[:, : self.level_dims[index + 1]]

    def _actnorm(self, name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scale = np.exp(self.parameters[f"{name}.scaled_log_scale"] * np.float32(LOGSCALE_FACTOR))
        return x * scale + self.parameters[f"{name}.bias"] * scale, scale

    def _coupling(self, name: str, x: np.ndarray) -> tuple[np.ndarray, tuple]:
        p = self.parameters
        split = p[f"{name}.0.weight"].shape[1]
        x1 = x[:, :split]
        hidden1 = np.maximum(x1 @ p[f"{name}.0.weight"].T + p[f"{name}.0.bias"], 0)
        hidden2 = np.maximum(hidden1 @ p[f"{name}.2.weight"].T + p[f"{name}.2.bias"], 0)
        shift = hidden2 @ p[f"{name}.4.weight"].T + p[f"{name}.4.bias"]
        return np.concatenate([x1, x[:, split:] + shift], axis=1), (x1, hidden1, hidden2, shift)

    def loss_and_gradients(self, x: np.ndarray, shift_penalty: float) -> float:
        """`glow.Glow.loss_and_gradients`: the training loss of batch X (raw vectors), with its gradient written
        into `grad`."""
        x = self.reduce(x)
        n = x.shape[0]
        per_element = np.float32(1.0 / (n * self.dim))
        logdet_weight, transport_weight = -per_element, np.float32(shift_penalty) * per_element
        tape, factored, squared_shifts, log_scale_sum = [], [], 0.0, 0.0
        for index, level in enumerate(self.steps):
            for actnorm, coupling in level:
                y, scale = self._actnorm(actnorm, x)
                log_scale_sum += float(self.parameters[f"{actnorm}.scaled_log_scale"].sum()) * LOGSCALE_FACTOR
                x, saved = self._coupling(coupling, y[:, ::-1])
                tape.append((actnorm, y, scale, coupling, saved))
                squared_shifts += float(np.vdot(saved[3], saved[3]))
            if index < len(self.steps) - 1:
                keep = self.level_dims[index + 1]
                factored.append(x[:, keep:])
                x = x[:, :keep]
        squared_z = sum(float(np.vdot(part, part)) for part in factored + [x])
        loss = ((0.5 * squared_z + shift_penalty * squared_shifts) * float(per_element) + 0.5 * _LOG_2PI
                - (log_scale_sum + float(self.reduction_logdet)) / self.dim)

        g = self.gradients
        grad = x * per_element  # d(loss)/dz = z / (n * dim), level by level from the last
        for index in reversed(range(len(self.steps))):
            if index < len(self.steps) - 1:
                grad = np.concatenate([grad, factored[index] * per_element], axis=1)
            for _ in self.steps[index]:
                actnorm, y, scale, coupling, (x1, hidden1, hidden2, shift) = tape.pop()
                # the coupling: y1 = x1, y2 = x2 + g(x1), and transport_weight * |g(x1)|^2 in the loss
                split = x1.shape[1]
                grad_y1, grad_y2 = grad[:, :split], grad[:, split:]
                grad_shift = grad_y2 + (2 * transport_weight) * shift
                np.matmul(grad_shift.T, hidden2, out=g[f"{coupling}.4.weight"])
                np.sum(grad_shift, 0, out=g[f"{coupling}.4.bias"])
                grad_hidden2 = (grad_shift @ self.parameters[f"{coupling}.4.weight"]) * (hidden2 > 0)
                np.matmul(grad_hidden2.T, hidden1, out=g[f"{coupling}.2.weight"])
                np.sum(grad_hidden2, 0, out=g[f"{coupling}.2.bias"])
                grad_hidden1 = (grad_hidden2 @ self.parameters[f"{coupling}.2.weight"]) * (hidden1 > 0)
                np.matmul(grad_hidden1.T, x1, out=g[f"{coupling}.0.weight"])
                np.sum(grad_hidden1, 0, out=g[f"{coupling}.0.bias"])
                grad = np.concatenate([grad_y1 + grad_hidden1 @ self.parameters[f"{coupling}.0.weight"], grad_y2],
                                      axis=1)
                grad = grad[:, ::-1]  # the reverse permutation's transpose is itself
                # the actnorm: y = (x + bias) * scale, and logdet_weight * n * sum(log_scale) in the loss
                grad_x = grad * scale
                np.sum(grad_x, 0, out=g[f"{actnorm}.bias"])
                grad_log_scale = g[f"{actnorm}.scaled_log_scale"]
                np.sum(grad * y, 0, out=grad_log_scale)
                grad_log_scale += np.float32(n) * logdet_weight
                grad_log_scale *= np.float32(LOGSCALE_FACTOR)
                grad = grad_x
        return loss

    def state_dict(self) -> dict[str, np.ndarray]:
        """The torch module's state dict, as arrays (its parameters, then the reduction's buffers)."""
        state = {name: array.copy() for name, array in self.parameters.items()}
        if self.reduction is not None:
            mean, weight, inverse_weight = self.reduction
            state.update({"reduction.mean": mean, "reduction.weight": weight,
                          "reduction.inverse_weight": inverse_weight,
                          "reduction.logdet": np.asarray(self.reduction_logdet, np.float32)})
        return state

    def forward_map(self) -> FlowForward:
        """This flow's x -> z (`glow.Glow.forward_map`, from these arrays)."""
        p = self.parameters
        levels = []
        for level in self.steps:
            steps = []
            for actnorm, coupling in level:
                scale = np.exp(p[f"{actnorm}.scaled_log_scale"] * np.float32(LOGSCALE_FACTOR))
                steps += [("actnorm", {"scale": scale, "shift": p[f"{actnorm}.bias"] * scale}), ("reverse", {}),
                          ("coupling", {"first": p[f"{coupling}.0.weight"].T, "first_bias": p[f"{coupling}.0.bias"],
                                        "second": p[f"{coupling}.2.weight"].T, "second_bias": p[f"{coupling}.2.bias"],
                                        "last": p[f"{coupling}.4.weight"].T, "last_bias": p[f"{coupling}.4.bias"]})]
            levels.append([(kind, {name: np.ascontiguousarray(array, dtype=np.float32)
                                   for name, array in arrays.items()}) for kind, arrays in steps])
        reduction = None if self.reduction is None else (self.reduction[0], self.reduction[1])
        return FlowForward(reduction, levels, self.level_dims[1:])


class Adam:
    """`torch.optim.Adam(fused=True)`'s step on one flat float32 parameter (its defaults: no weight decay), in the
    arithmetic of torch's fused CPU kernel: bias corrections in double, the moments and the update in float32."""

    def __init__(self, parameter: np.ndarray, lr: float):
        self.parameter, self.lr, self.steps = parameter, float(lr), 0
        self.exp_avg = np.zeros_like(parameter)
        self.exp_avg_sq = np.zeros_like(parameter)

    def step(self, grad: np.ndarray) -> None:
        beta1, beta2 = BETAS
        self.steps += 1
        step_size = np.float32(self.lr / (1 - beta1 ** self.steps))
        correction2_sqrt = np.float32(math.sqrt(1 - beta2 ** self.steps))
        self.exp_avg += np.float32(1 - beta1) * (grad - self.exp_avg)  # lerp towards grad
        self.exp_avg_sq *= np.float32(beta2)
        self.exp_avg_sq += np.float32(1 - beta2) * np.square(grad)
        denominator = np.sqrt(self.exp_avg_sq) / correction2_sqrt + np.float32(EPS)
        self.parameter -= step_size * self.exp_avg / denominator


def fit(X: np.ndarray, batches: list[np.ndarray], levels: int, depth: int, width: int, lr: float,
        shift_penalty: float, seed: int, k: int | None = None) -> tuple[NumpyFlow, list[float]]:
    """The flow fitted on X's rows, a step per array of BATCHES (row numbers; `flow.FlowCalibrator.fit` draws them),
    and each step's loss."""
    flow = NumpyFlow(X.shape[1], levels, depth, width, seed, reduction_arrays(X, k) if k is not None else None)
    optimizer, losses = Adam(flow.flat, lr), []
    for step, rows in enumerate(batches):
        batch = np.asarray(X[rows], dtype=np.float32)
        if step == 0:
            flow.initialize(batch)
        losses.append(flow.loss_and_gradients(batch, shift_penalty))
        norm = np.float32(math.sqrt(float(np.vdot(flow.grad, flow.grad))))
        flow.grad *= min(np.float32(MAX_GRAD_NORM) / (norm + np.float32(1e-6)), np.float32(1.0))
        optimizer.step(flow.grad)
    return flow, losses


def _uniform(stream: np.random.MT19937, shape: tuple[int, ...], bound: float) -> np.ndarray:
    """torch's CPU `uniform_(-bound, bound)` of a float32 tensor: each number from one 32-bit output, its low 24
    bits scaled to [0, 1), then x * (to - from) + from (one fused multiply-add, rounded once to float32)."""
    low, high = np.float32(-bound), np.float32(bound)
    unit = (stream.random_raw(math.prod(shape)) & 0xFFFFFF).astype(np.float64) * 2.0 ** -24
    return (unit * np.float64(high - low) + np.float64(low)).astype(np.float32).reshape(shape)

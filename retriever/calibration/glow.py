"""The Glow of BERT-flow (Li et al., EMNLP 2020): a normalizing flow that maps sentence vectors to a standard
Gaussian, its layers, and the hand-written gradients it trains with (`FlowCalibrator` in `flow` fits it, and applies
its map in NumPy, `Glow.forward_map`).

The architecture follows the paper's code (bohanli/BERT-flow, `flow/glow_ops_1x1.py`) on 1 x 1 "images":
  step  = ActNorm -> fixed permutation (Reverse) -> AdditiveCoupling       (log|det| comes only from ActNorm)
          (`mixing="lu"` adds Glow's LU 1 x 1 mixing after the permutation, which has a log|det| of its own)
  level = `depth` steps; after every level but the last, half of the dimensions are factored out, scored under
          N(0, I) and passed to the output unchanged: z = [factored_1, ..., factored_{L-1}, final].
Each transform is a small module whose `forward(x)` returns `(y, logdet)` and whose `inverse(y)` returns `x`.
Near-constant dimensions keep ActNorm scale 1 (explained where it is done). Training computes its gradients by
hand (`Glow.loss_and_gradients`, checked against autograd in the tests).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from retriever.calibration.flow_forward import FlowForward, level_dims
from retriever.calibration.flow_numpy import check_levels, reduction_arrays
from retriever.errors import RetrieverError

# Glow/BERT-flow store actnorm log-scales divided by 3 and multiply them back: a 3x larger effective step size for
# the scales under Adam, which helps one epoch of training move them far enough.
LOGSCALE_FACTOR = 3.0
# An ActNorm input dimension whose std on the init batch is at most this fraction of the largest is constant.
CONSTANT_STD = 1e-6
_LOG_2PI = math.log(2 * math.pi)


class LossWeights(NamedTuple):
    """How the training loss weighs each transform's own terms, summed over the batch."""

    logdet: float  # weight of log|det J| (ActNorm, LUMixing)
    transport: float  # weight of the squared shift (AdditiveCoupling)


class ActNormSaved(NamedTuple):
    """What ActNorm's backward needs from its forward."""

    y: Tensor
    scale: Tensor
    log_scale: Tensor


class CouplingSaved(NamedTuple):
    """What AdditiveCoupling's backward needs from its forward; `shift` is g(x1)."""

    x1: Tensor
    hidden1: Tensor
    hidden2: Tensor
    shift: Tensor


class ActNorm(nn.Module):
    """y = (x + bias) * exp(log_scale), per dimension; `initialize` sets both so a batch gets mean 0, std 1."""

    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))
        self.scaled_log_scale = nn.Parameter(torch.zeros(dim))  # log_scale / LOGSCALE_FACTOR

    @property
    def log_scale(self) -> Tensor:
        return self.scaled_log_scale * LOGSCALE_FACTOR

    @torch.no_grad()
    def initialize(self, x: Tensor) -> None:
        mean = x.mean(0)
        std = (x - mean).pow(2).mean(0).sqrt()
        log_scale = -torch.log(std + 1e-6)  # +1e-6 as in Glow
        # Dimensions that are constant up to round-off (MiniLM's last layer has two at ~1e-32) keep scale 1: Glow's
        # 1e6 would be compounded by every later ActNorm and overflow the gradients to inf.
        constant = std <= CONSTANT_STD * std.max()
        self.bias.copy_(-mean)
        self.scaled_log_scale.copy_(torch.where(constant, 0.0, log_scale) / LOGSCALE_FACTOR)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        y, _ = self.forward_saving(x)
        return y, self.log_scale.sum().expand(x.shape[0])

    def forward_saving(self, x: Tensor) -> tuple[Tensor, ActNormSaved]:
        """y and what `backward` needs."""
        log_scale = self.log_scale
        scale = log_scale.exp()
        y = torch.addcmul(self.bias * scale, x, scale)  # one pass over x
        return y, ActNormSaved(y, scale, log_scale)

    def backward(self, saved: ActNormSaved, grad_y: Tensor, weights: LossWeights) -> Tensor:
        """d(loss)/dx; writes d(loss)/d(parameters) into their .grad.

        loss = <grad_y, y> + weights.logdet * (log|det| summed over the batch)."""
        grad_x = grad_y * saved.scale
        torch.sum(grad_x, 0, out=_grad(self.bias))
        # dy/d(log_scale) = y, and every vector's log|det| is sum(log_scale).
        grad_log_scale = torch.sum(grad_y * saved.y, 0, out=_grad(self.scaled_log_scale))
        grad_log_scale.add_(len(grad_y) * weights.logdet).mul_(LOGSCALE_FACTOR)
        return grad_x

    def inverse(self, y: Tensor) -> Tensor:
        return y * (-self.log_scale).exp() - self.bias


class Reverse(nn.Module):
    """Reverses the order of the dimensions (log|det| = 0), so the halves swap roles in the next coupling.

    The default permutation, and its own class because `flip` is ~8x faster than a gather on CPU."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x.flip(1), x.new_zeros(x.shape[0])

    def forward_saving(self, x: Tensor) -> tuple[Tensor, None]:
        return x.flip(1), None

    def backward(self, saved: None, grad_y: Tensor, weights: LossWeights) -> Tensor:
        return grad_y.flip(1)  # a permutation's Jacobian is orthogonal: its transpose is its inverse

    def inverse(self, y: Tensor) -> Tensor:
        return y.flip(1)


class Permutation(nn.Module):
    """A fixed random reordering of the dimensions (log|det| = 0)."""

    def __init__(self, order: Tensor):
        super().__init__()
        self.register_buffer("order", order)
        self.register_buffer("inverse_order", torch.argsort(order))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x.index_select(1, self.order), x.new_zeros(x.shape[0])

    def forward_saving(self, x: Tensor) -> tuple[Tensor, None]:
        return x.index_select(1, self.order), None

    def backward(self, saved: None, grad_y: Tensor, weights: LossWeights) -> Tensor:
        return self.inverse(grad_y)  # a permutation's Jacobian is orthogonal: its transpose is its inverse

    def inverse(self, y: Tensor) -> Tensor:
        return y.index_select(1, self.inverse_order)


class LUSaved(NamedTuple):
    """What LUMixing's backward needs from its forward."""

    x: Tensor
    weight: Tensor
    lower: Tensor  # L with its unit diagonal
    upper: Tensor  # U with its diagonal exp(log_scale)
    log_scale: Tensor


class LUMixing(nn.Module):
    """Glow's invertible 1 x 1 convolution, LU-parametrised: y = x W^T with W = L U, L unit lower-triangular,
    U upper-triangular with diagonal exp(log_scale), so log|det W| = sum(log_scale) costs nothing.

    It starts as the identity (L = I, U = I), so an untrained flow with mixing equals one without; training then
    learns which directions the couplings should see together, where a fixed permutation cannot choose."""

    def __init__(self, dim: int):
        super().__init__()
        self.lower = nn.Parameter(torch.zeros(dim, dim))  # only the strictly lower part is used
        self.upper = nn.Parameter(torch.zeros(dim, dim))  # only the strictly upper part is used
        self.log_scale = nn.Parameter(torch.zeros(dim))
        self.register_buffer("lower_mask", torch.tril(torch.ones(dim, dim), -1))
        self.register_buffer("eye", torch.eye(dim))

    def _factors(self) -> tuple[Tensor, Tensor]:
        lower = torch.addcmul(self.eye, self.lower, self.lower_mask)
        upper = self.upper * self.lower_mask.t() + torch.diag(self.log_scale.exp())
        return lower, upper

    def weight(self) -> Tensor:
        lower, upper = self._factors()
        return lower @ upper

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x @ self.weight().t(), self.log_scale.sum().expand(x.shape[0])

    def forward_saving(self, x: Tensor) -> tuple[Tensor, LUSaved]:
        lower, upper = self._factors()
        weight = lower @ upper
        return x @ weight.t(), LUSaved(x, weight, lower, upper, self.log_scale)

    def backward(self, saved: LUSaved, grad_y: Tensor, weights: LossWeights) -> Tensor:
        """d(loss)/dx; writes d(loss)/d(parameters) into their .grad.

        loss = <grad_y, x W^T> + weights.logdet * n * sum(log_scale); W = L U, so dW gives dL = dW U^T and
        dU = L^T dW, each kept on its own triangle."""
        grad_weight = grad_y.t() @ saved.x
        torch.mul(grad_weight @ saved.upper.t(), self.lower_mask, out=_grad(self.lower))
        grad_upper = saved.lower.t() @ grad_weight
        torch.mul(grad_upper, self.lower_mask.t(), out=_grad(self.upper))
        grad_log_scale = torch.mul(torch.diagonal(grad_upper), saved.log_scale.exp(), out=_grad(self.log_scale))
        grad_log_scale.add_(len(grad_y) * weights.logdet)
        return grad_y @ saved.weight

    def inverse(self, y: Tensor) -> Tensor:
        lower, upper = self._factors()
        # y^T = L U x^T: two triangular solves instead of an inverse.
        solved = torch.linalg.solve_triangular(lower, y.t(), upper=False, unitriangular=True)
        return torch.linalg.solve_triangular(upper, solved, upper=True).t()


class Reduction(nn.Module):
    """A fixed linear first stage: y = (x - mean) W with W (dim, k) the top-k PCA-whitening directions of the
    fit set (`whitening-k`). The flow then models a k-dimensional space that is already decorrelated, and only has
    to learn what a linear map cannot; log|det| is that of the kept directions (a density on that subspace)."""

    def __init__(self, mean: Tensor, weight: Tensor, inverse_weight: Tensor):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("weight", weight)  # (dim, k)
        self.register_buffer("inverse_weight", inverse_weight)  # (k, dim): back to the kept subspace
        self.register_buffer("logdet", -0.5 * torch.log(torch.square(weight).sum(0).reciprocal()).sum())

    @classmethod
    def empty(cls, dim: int, k: int) -> Reduction:
        return cls(torch.zeros(dim), torch.zeros(dim, k), torch.zeros(k, dim))

    @classmethod
    def fit(cls, X: np.ndarray, k: int) -> Reduction:
        """`whitening-k` fitted on X (BERT-whitening to the top-k principal directions, streamed over row chunks).

        Scaling them to unit variance is the maximum-likelihood Gaussian; the flow's first ActNorm would undo any
        softer scaling (measured: shrinking the variances by 0.1 or 0.3 of their mean moved no score by > 0.25)."""
        return cls(*(torch.from_numpy(array) for array in reduction_arrays(X, k)))

    @property
    def out_dim(self) -> int:
        return self.weight.shape[1]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return (x - self.mean) @ self.weight, self.logdet.expand(x.shape[0])

    def inverse(self, y: Tensor) -> Tensor:
        return y @ self.inverse_weight + self.mean


class AdditiveCoupling(nn.Module):
    """y1 = x1, y2 = x2 + g(x1): volume-preserving, inverted by subtracting g(y1).

    x1 is the first floor(dim/2) dimensions, so with an odd dim the shifted half is the larger one and, under the
    reverse permutation, the middle dimension is still transformed at every step.
    g is a 3-layer ReLU MLP whose last layer starts at zero, so the untrained coupling is the identity.
    """

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.split = dim // 2
        last = nn.Linear(width, dim - self.split)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.shift = nn.Sequential(
            nn.Linear(self.split, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), last
        )
        self._linears = (self.shift[0], self.shift[2], last)  # a plain tuple: no second registration, fast access

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        y, _ = self.forward_saving(x)
        return y, x.new_zeros(x.shape[0])

    def forward_saving(self, x: Tensor) -> tuple[Tensor, CouplingSaved]:
        """y and what `backward` needs, including the shift: how far this coupling moves each vector."""
        first, second, last = self._linears
        x1, x2 = x[:, : self.split], x[:, self.split :]
        hidden1 = torch.relu(F.linear(x1, first.weight, first.bias))
        hidden2 = torch.relu(F.linear(hidden1, second.weight, second.bias))
        shift = F.linear(hidden2, last.weight, last.bias)
        return torch.cat([x1, x2 + shift], dim=1), CouplingSaved(x1, hidden1, hidden2, shift)

    def backward(self, saved: CouplingSaved, grad_y: Tensor, weights: LossWeights) -> Tensor:
        """d(loss)/dx; writes d(loss)/d(parameters) into their .grad.

        loss = <grad_y, y> + weights.transport * (squared shifts summed over the batch)."""
        first, second, last = self._linears
        x1, hidden1, hidden2, shift = saved
        grad_y1, grad_y2 = grad_y[:, : self.split], grad_y[:, self.split :]
        grad_shift = torch.add(grad_y2, shift, alpha=2 * weights.transport)
        torch.mm(grad_shift.t(), hidden2, out=_grad(last.weight))
        torch.sum(grad_shift, 0, out=_grad(last.bias))
        grad_hidden2 = _relu_backward(grad_shift @ last.weight, hidden2)
        torch.mm(grad_hidden2.t(), hidden1, out=_grad(second.weight))
        torch.sum(grad_hidden2, 0, out=_grad(second.bias))
        grad_hidden1 = _relu_backward(grad_hidden2 @ second.weight, hidden1)
        torch.mm(grad_hidden1.t(), x1, out=_grad(first.weight))
        torch.sum(grad_hidden1, 0, out=_grad(first.bias))
        grad_x1 = torch.addmm(grad_y1, grad_hidden1, first.weight)  # x1 also passes straight through to y1
        return torch.cat([grad_x1, grad_y2], dim=1)

    def inverse(self, y: Tensor) -> Tensor:
        y1, y2 = y[:, : self.split], y[:, self.split :]
        return torch.cat([y1, y2 - self.shift(y1)], dim=1)


class Glow(nn.Module):
    """Multi-scale flow x -> z of the same dimension (of K with a reduction); `log_prob` is exact by the change of
    variables (on the reduction's K-dimensional subspace, with one)."""

    def __init__(self, dim: int, levels: int = 2, depth: int = 3, width: int = 32, permutation: str = "reverse",
                 seed: int = 0, mixing: str = "none", reduce_to: int | None = None):
        super().__init__()
        # With a reduction the levels model its k-dimensional output; `Reduction.fit` fills it before training.
        self.reduction = Reduction.empty(dim, reduce_to) if reduce_to is not None else None
        flow_dim = reduce_to if reduce_to is not None else dim
        check_levels(flow_dim, levels)
        self.dim = flow_dim  # the dimension of z, which the loss is averaged over
        self.level_dims = level_dims(flow_dim, levels)
        # Weights and random permutations come from this seed alone, without touching the global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.levels = nn.ModuleList(
                nn.ModuleList(
                    transform
                    for _ in range(depth)
                    for transform in _step(d, width, permutation, mixing)
                )
                for d in self.level_dims
            )

    @property
    def factored_dims(self) -> list[int]:
        """Dimensions factored out after each level but the last."""
        return [d // 2 for d in self.level_dims[:-1]]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z, logdet, _ = self._forward(x, measure_transport=False)
        return z, logdet

    def _forward(self, x: Tensor, measure_transport: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """(z, log|det J|, transport): transport is the squared length of all coupling shifts, per vector."""
        logdet = x.new_zeros(x.shape[0])
        if self.reduction is not None:
            x, logdet = self.reduction(x)
        transport = x.new_zeros(x.shape[0]) if measure_transport else None
        factored = []
        for index, level in enumerate(self.levels):
            for transform in level:
                if measure_transport and isinstance(transform, AdditiveCoupling):
                    x, saved = transform.forward_saving(x)
                    transport = transport + saved.shift.pow(2).sum(1)
                else:
                    x, step_logdet = transform(x)
                    logdet = logdet + step_logdet
            if index < len(self.levels) - 1:
                keep = self.level_dims[index + 1]
                factored.append(x[:, keep:])
                x = x[:, :keep]
        return torch.cat(factored + [x], dim=1), logdet, transport

    @torch.no_grad()
    def forward_map(self) -> FlowForward:
        """This flow's x -> z in NumPy (its parameters read out, float32): what calibrates vectors."""
        def array(tensor: Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float32)

        reduction = None if self.reduction is None else (array(self.reduction.mean), array(self.reduction.weight))
        levels = [[_step_arrays(transform, array) for transform in level] for level in self.levels]
        return FlowForward(reduction, levels, self.level_dims[1:])

    def inverse(self, z: Tensor) -> Tensor:
        *factored, x = torch.split(z, self.factored_dims + [self.level_dims[-1]], dim=1)
        for index in reversed(range(len(self.levels))):
            if index < len(self.levels) - 1:
                x = torch.cat([x, factored[index]], dim=1)
            for transform in reversed(self.levels[index]):
                x = transform.inverse(x)
        return x if self.reduction is None else self.reduction.inverse(x)

    def log_prob(self, x: Tensor) -> Tensor:
        """log p(x) = sum of N(0, 1) log-densities of every z coordinate (final and factored out) + log|det J|."""
        z, logdet = self(x)
        return _standard_normal_log_density(z) + logdet

    def transport(self, x: Tensor) -> Tensor:
        """How far the couplings move each vector: the squared length of all their shifts."""
        return self._forward(x, measure_transport=True)[2]

    def loss(self, x: Tensor, shift_penalty: float) -> Tensor:
        """The training objective, differentiable by autograd: (shift_penalty * transport - log p(x)).mean() / dim.

        Per dimension like the paper's bits/dim, so gradient clipping at 1.0 means the same for any dim."""
        z, logdet, transport = self._forward(x, measure_transport=True)
        return (shift_penalty * transport - _standard_normal_log_density(z) - logdet).mean() / self.dim

    @torch.no_grad()  # no autograd graph: the gradients are computed below
    def loss_and_gradients(self, x: Tensor, shift_penalty: float) -> Tensor:
        """`loss(x, shift_penalty)`, with its gradient written by hand into every parameter's .grad, which must
        exist (`share_one_buffer` gives them; a missing one raises rather than losing the gradient).

        At batch 32 a step is ~250 tiny ops whose per-op overhead outweighs their arithmetic; autograd's recording
        and replay add to it, and this hand-derived pass takes about half the time (`flow_gradient_step` in
        benchmarks/results/calibration_speed_cpu.json)."""
        reduction_logdet = 0.0
        if self.reduction is not None:  # fixed: nothing to learn, so only its constant log|det| enters the loss
            x, logdets = self.reduction(x)
            reduction_logdet = logdets[0]
        n = x.shape[0]
        per_element = 1.0 / (n * self.dim)
        # Each transform's own terms in the loss, as weights of their sums over the batch.
        weights = LossWeights(logdet=-per_element, transport=shift_penalty * per_element)
        tape, factored, shifts, log_scales = [], [], [], []  # tape: (transform, what its backward needs), in order
        for index, level in enumerate(self.levels):
            for transform in level:
                x, context = transform.forward_saving(x)
                tape.append((transform, context))
                if isinstance(transform, AdditiveCoupling):
                    shifts.append(context.shift)
                elif isinstance(transform, (ActNorm, LUMixing)):
                    log_scales.append(context.log_scale)
            if index < len(self.levels) - 1:
                keep = self.level_dims[index + 1]
                factored.append(x[:, keep:])
                x = x[:, :keep]
        loss = ((0.5 * _squared_norm(factored + [x]) + shift_penalty * _squared_norm(shifts)) * per_element
                + 0.5 * _LOG_2PI - (torch.cat(log_scales).sum() + reduction_logdet) / self.dim)

        grad = x * per_element  # d(loss)/dz = z / (n * dim), level by level from the last
        for index in reversed(range(len(self.levels))):
            if index < len(self.levels) - 1:
                grad = torch.cat([grad, factored[index] * per_element], dim=1)
            for _ in self.levels[index]:
                transform, context = tape.pop()
                grad = transform.backward(context, grad, weights)
        return loss

    @torch.no_grad()
    def initialize(self, x: Tensor) -> None:
        """Data-dependent init: each ActNorm gets mean 0, std 1 on this batch, as it arrives through the flow."""
        if self.reduction is not None:
            x, _ = self.reduction(x)
        for index, level in enumerate(self.levels):
            for transform in level:
                if isinstance(transform, ActNorm):
                    transform.initialize(x)
                x, _ = transform(x)
            if index < len(self.levels) - 1:
                x = x[:, : self.level_dims[index + 1]]


def _squared_norm(tensors: list[Tensor]) -> Tensor:
    """Sum of the squares of all elements of all tensors."""
    # One norm kernel for the whole list: the private op torch's own clip_grad_norm_ is built on.
    return torch.stack(torch._foreach_norm(tensors)).square().sum()


def _grad(parameter: nn.Parameter) -> Tensor:
    """The .grad a hand-derived backward writes into. `out=None` would silently drop the gradient instead."""
    if parameter.grad is None:
        raise RuntimeError("loss_and_gradients writes into existing .grad tensors; this parameter has none")
    return parameter.grad


def _relu_backward(grad_output: Tensor, output: Tensor) -> Tensor:
    """The gradient through y = relu(x), given y: zero where y is 0 (ReLU's own backward kernel, one op)."""
    return torch.ops.aten.threshold_backward(grad_output, output, 0)


def _standard_normal_log_density(z: Tensor) -> Tensor:
    return -0.5 * (z.pow(2).sum(1) + z.shape[1] * _LOG_2PI)


def _permutation(dim: int, kind: str) -> nn.Module:
    return Reverse() if kind == "reverse" else Permutation(torch.randperm(dim))  # randperm: seeded by the caller


def _step(dim: int, width: int, permutation: str, mixing: str) -> tuple[nn.Module, ...]:
    """One flow step: ActNorm -> permutation (-> LU mixing) -> AdditiveCoupling."""
    mixer = (LUMixing(dim),) if mixing == "lu" else ()
    return (ActNorm(dim), _permutation(dim, permutation), *mixer, AdditiveCoupling(dim, width))


def _step_arrays(transform: nn.Module, array) -> tuple[str, dict[str, np.ndarray]]:
    """A step's kind and arrays as `FlowForward` applies them (ARRAY: a tensor read out as float32)."""
    if isinstance(transform, ActNorm):
        scale = transform.log_scale.exp()
        return "actnorm", {"scale": array(scale), "shift": array(transform.bias * scale)}
    if isinstance(transform, Reverse):
        return "reverse", {}
    if isinstance(transform, Permutation):
        return "permutation", {"order": transform.order.cpu().numpy().astype(np.int64)}
    if isinstance(transform, LUMixing):
        return "mixing", {"weight": array(transform.weight().t())}
    first, second, last = transform._linears
    return "coupling", {"first": array(first.weight.t()), "first_bias": array(first.bias),
                        "second": array(second.weight.t()), "second_bias": array(second.bias),
                        "last": array(last.weight.t()), "last_bias": array(last.bias)}

"""A fitted flow's map x -> z in NumPy: every vector a flow calibrates, the build's and each query's, goes through
`FlowForward`, so a search needs no torch (importing it took a one-off search most of its time) and stored and
query vectors come from the same operations (to float rounding: a query's few rows multiply on the calling thread,
`numeric.product`, a build's blocks through BLAS). Torch fits the flow (`glow`, `flow`); `Glow.forward_map` reads its
parameters into a `FlowForward`, which is saved beside the flow's weights.

The steps are the torch module's (`glow`): an optional whitening to K dimensions (`flow-K`), then for each level its
steps, each an ActNorm, a permutation (reversed or a fixed order), an optional LU mixing and an additive coupling
(x2 += MLP(x1)), and after every level but the last the second part of the dimensions factored out to the output:
z = [factored_1, ..., factored_{L-1}, final]. Float32 throughout.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError
from retriever.numeric import product

PERMUTATIONS = ("reverse", "random")
MIXINGS = ("none", "lu")
# Each step's kind and the arrays it holds (`Step`), in the order `__call__` applies them.
STEP_ARRAYS = {"actnorm": ("scale", "shift"), "reverse": (), "permutation": ("order",), "mixing": ("weight",),
               "coupling": ("first", "first_bias", "second", "second_bias", "last", "last_bias")}
_LAYOUT = "layout"  # the npz entry holding the steps' kinds, the levels' kept dimensions and the weights' digest
# Rows mapped at a time: few enough that a block's intermediate arrays stay in the CPU's cache through the steps'
# elementwise work (timed in benchmarks/results/README.md, "a flow calibrates in NumPy").
BLOCK_ROWS = 2048


class FlowForward:
    """x -> z: REDUCTION (mean, weight: (x - mean) @ weight) or None, then LEVELS, each a list of (kind, arrays)
    steps (`STEP_ARRAYS`: matrices stored as they multiply rows, (in, out)), keeping KEEP[i] dimensions after level
    i (one fewer entry than levels)."""

    def __init__(self, reduction: tuple[np.ndarray, np.ndarray] | None,
                 levels: list[list[tuple[str, dict[str, np.ndarray]]]], keep: list[int], weights_digest: str = ""):
        if len(keep) != len(levels) - 1 or not levels:
            raise RetrieverError(f"a flow of {len(levels)} levels keeps dimensions after {len(levels) - 1}, not "
                                 f"{len(keep)}")
        self.reduction, self.levels, self.keep = reduction, levels, list(keep)
        self.weights_digest = weights_digest  # sha256 of the torch weights it was read from (`flow.FORWARD_FILE`)
        first = reduction[1].shape[1] if reduction is not None else _in_dim(levels)
        self.in_dim = reduction[0].shape[0] if reduction is not None else first
        self.out_dim = first

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """z for the rows of X (float32 (n, in_dim) -> (n, out_dim)), BLOCK_ROWS rows at a time."""
        x = np.asarray(x, dtype=np.float32)
        if len(x) <= BLOCK_ROWS:
            return self._block(x)
        return np.concatenate([self._block(x[start : start + BLOCK_ROWS]) for start in range(0, len(x), BLOCK_ROWS)])

    def _block(self, x: np.ndarray) -> np.ndarray:
        if self.reduction is not None:
            mean, weight = self.reduction
            x = product(x - mean, weight)
        factored = []
        for index, level in enumerate(self.levels):
            for kind, arrays in level:
                x = _apply(kind, arrays, x)
            if index < len(self.levels) - 1:
                factored.append(x[:, self.keep[index]:])
                x = x[:, : self.keep[index]]
        return np.concatenate(factored + [x], axis=1, dtype=np.float32)

    def mismatch(self, dim: int, levels: int, depth: int, width: int, permutation: str, mixing: str,
                 k: int | None) -> str | None:
        """What differs between this map and a flow of those settings on DIM-dim vectors (None: nothing)."""
        steps = ["actnorm", "reverse" if permutation == "reverse" else "permutation",
                 *(["mixing"] if mixing == "lu" else []), "coupling"] * depth
        dims = level_dims(k if k is not None else dim, levels)
        found = {"input dimensions": self.in_dim, "reduced to": self.reduction[1].shape[1] if self.reduction else None,
                 "levels": len(self.levels), "steps": [[kind for kind, _ in level] for level in self.levels],
                 "kept dimensions": self.keep}
        described = {"input dimensions": dim, "reduced to": k, "levels": levels, "steps": [steps] * levels,
                     "kept dimensions": dims[1:]}
        differing = [name for name in found if found[name] != described[name]]
        if differing:
            return f"its {differing[0]} differ"
        if self.reduction is not None and (self.reduction[0].shape != (dim,) or self.reduction[1].shape != (dim, k)):
            return "its whitening's arrays have other shapes"
        for level, level_dim in zip(self.levels, dims):
            for kind, arrays in level:
                if any(_shapes(kind, level_dim, width)[name] != arrays[name].shape for name in STEP_ARRAYS[kind]):
                    return f"its {kind} arrays have other shapes"
                if kind == "permutation" and not np.array_equal(np.sort(arrays["order"]), np.arange(level_dim)):
                    return "a permutation of it is not one"
        return None

    def save(self, path: Path) -> None:
        """One .npz: every array, and the layout as JSON (read back with pickles refused)."""
        arrays = {}
        if self.reduction is not None:
            arrays["reduction.mean"], arrays["reduction.weight"] = self.reduction
        kinds = []
        for index, level in enumerate(self.levels):
            kinds.append([kind for kind, _ in level])
            for number, (kind, step) in enumerate(level):
                arrays.update({f"{index}.{number}.{name}": step[name] for name in STEP_ARRAYS[kind]})
        layout = {"kinds": kinds, "keep": self.keep, "reduction": self.reduction is not None,
                  "weights_sha256": self.weights_digest}
        with open(path, "wb") as file:
            np.savez(file, **arrays, **{_LAYOUT: np.array(json.dumps(layout))})

    @classmethod
    def load(cls, path: Path) -> FlowForward:
        try:
            with np.load(path, allow_pickle=False) as saved:
                layout = json.loads(str(saved[_LAYOUT]))
                reduction = ((saved["reduction.mean"], saved["reduction.weight"]) if layout["reduction"] else None)
                levels = [[(kind, {name: saved[f"{index}.{number}.{name}"] for name in STEP_ARRAYS[kind]})
                           for number, kind in enumerate(kinds)]
                          for index, kinds in enumerate(layout["kinds"])]
            return cls(reduction, levels, layout["keep"], str(layout["weights_sha256"]))
        except (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, zipfile.BadZipFile) as error:
            raise RetrieverError(f"{path} is not a flow's saved map ({error})") from None


def level_dims(dim: int, levels: int) -> list[int]:
    """The dimensions entering each of LEVELS levels of a flow on DIM: each level keeps the larger half (ceil) and
    factors out the rest."""
    dims = [dim]
    for _ in range(levels - 1):
        dims.append(dims[-1] - dims[-1] // 2)
    return dims


def _apply(kind: str, arrays: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """One step of a level (as the torch module computes it: `glow.ActNorm`, `Reverse`, `Permutation`, `LUMixing`,
    `AdditiveCoupling`)."""
    if kind == "actnorm":
        return x * arrays["scale"] + arrays["shift"]
    if kind == "reverse":
        return x[:, ::-1]
    if kind == "permutation":
        return x[:, arrays["order"]]
    if kind == "mixing":
        return product(np.ascontiguousarray(x), arrays["weight"])
    if kind != "coupling":
        raise RetrieverError(f"a flow's saved map has a step of unknown kind {kind!r}")
    split = arrays["first"].shape[0]
    kept = np.ascontiguousarray(x[:, :split])
    hidden = np.maximum(product(kept, arrays["first"]) + arrays["first_bias"], 0)
    hidden = np.maximum(product(hidden, arrays["second"]) + arrays["second_bias"], 0)
    shift = product(hidden, arrays["last"]) + arrays["last_bias"]
    return np.concatenate([kept, x[:, split:] + shift], axis=1)


def _shapes(kind: str, dim: int, width: int) -> dict[str, tuple[int, ...]]:
    """The shapes of a step's arrays in a level of DIM dimensions, its couplings WIDTH wide."""
    split = dim // 2
    return {"actnorm": {"scale": (dim,), "shift": (dim,)}, "reverse": {}, "permutation": {"order": (dim,)},
            "mixing": {"weight": (dim, dim)},
            "coupling": {"first": (split, width), "first_bias": (width,), "second": (width, width),
                         "second_bias": (width,), "last": (width, dim - split), "last_bias": (dim - split,)}}[kind]


def _in_dim(levels: list[list[tuple[str, dict[str, np.ndarray]]]]) -> int:
    """The first level's width, read from its first ActNorm."""
    for kind, arrays in levels[0]:
        if kind == "actnorm":
            return len(arrays["scale"])
    raise RetrieverError("a flow's saved map has no ActNorm in its first level")

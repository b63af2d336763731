"""Vector matrices on disk as .npy files: written row chunk by row chunk, read memory-mapped.

`NpyAppender` streams rows into a .npy whose row count is not known in advance: the header reserves room for
any shape and is rewritten with the rows written so far at every `flush`, so the file is a valid .npy after each
flush and a killed writer can be resumed from its last flushed row (`NpyAppender.resume`). `VectorSource` reads
the vectors a user computed elsewhere (`build --vectors`): one .npy, or a folder of .npy shards in name order.

numpy parses a .npy header with `ast.literal_eval`, which some CPython versions cannot run in two threads at once
("SystemError: AST constructor recursion depth mismatch", python/cpython#106905): every .npy or .npz read in
this package goes through `load_npy` or `npy_layout`, which parse headers under one lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError

# magic (6) + version (2) + header length (2) + header; 128 in all holds any 2-D shape and stays 64-byte aligned.
_HEADER_BYTES = 128
_MAGIC = b"\x93NUMPY\x01\x00"
DTYPES = {"float16": np.float16, "float32": np.float32, "int64": np.int64, "int32": np.int32, "uint16": np.uint16}
# Rows per block when checking or copying a source: 65,536 x 768 float32 is 200 MB.
BLOCK_ROWS = 65536
# Held while numpy parses a header (see the module's docstring). Reentrant: a caller may hold it around a load.
HEADER_LOCK = threading.RLock()


def load_npy(path: str | Path, mmap_mode: str | None = None):
    """`np.load` under HEADER_LOCK. With MMAP_MODE only the header is read; without it, the whole (small) array.
    An .npz is parsed lazily, array by array: read it inside `with HEADER_LOCK:`."""
    with HEADER_LOCK:
        return np.load(path, mmap_mode=mmap_mode)


def _header(dtype: np.dtype, rows: int, dim: int | None) -> bytes:
    shape = (rows,) if dim is None else (rows, dim)
    text = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    body = text.encode("latin1")
    room = _HEADER_BYTES - len(_MAGIC) - 2
    if len(body) + 1 > room:
        raise RetrieverError(f"shape ({rows}, {dim}) does not fit a .npy header")
    body = body.ljust(room - 1) + b"\n"
    return _MAGIC + len(body).to_bytes(2, "little") + body


class NpyAppender:
    """Append rows to a 2-D .npy file (or values to a 1-D one: dim None); `flush()` makes them durable and readable."""

    def __init__(self, path: str | Path, dim: int | None, dtype: str = "float32", rows: int = 0):
        """Create PATH (rows=0) or reopen it to append after its first ROWS rows (a later part is cut off)."""
        self.path = Path(path)
        self.dim, self.dtype = (None if dim is None else int(dim)), np.dtype(DTYPES[dtype])
        self.rows = int(rows)
        self._row_bytes = (self.dim or 1) * self.dtype.itemsize
        if rows == 0:
            self._file = open(self.path, "w+b")
            self._file.write(_header(self.dtype, 0, self.dim))
        else:
            self._file = open(self.path, "r+b")
            self._file.truncate(_HEADER_BYTES + self.rows * self._row_bytes)
            self._file.seek(0, os.SEEK_END)

    @classmethod
    def resume(cls, path: str | Path, dim: int | None, dtype: str, rows: int) -> NpyAppender:
        """Reopen a file this class wrote, keeping its first ROWS rows (they must all be there)."""
        path = Path(path)
        needed = _HEADER_BYTES + rows * (dim or 1) * np.dtype(DTYPES[dtype]).itemsize
        if not path.is_file() or path.stat().st_size < needed:
            raise RetrieverError(f"{path}: cannot resume, it holds fewer than {rows} rows")
        return cls(path, dim, dtype, rows)

    def append(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        if (rows.ndim != 1) if self.dim is None else (rows.ndim != 2 or rows.shape[1] != self.dim):
            raise RetrieverError(f"rows of shape {rows.shape} do not fit a ({self.dim})-column matrix")
        self._file.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())
        self.rows += len(rows)

    def flush(self) -> None:
        """Write the header for the rows appended so far and fsync: the file is now a valid .npy of them."""
        self._file.flush()
        end = self._file.tell()
        self._file.seek(0)
        self._file.write(_header(self.dtype, self.rows, self.dim))
        self._file.seek(end)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()

    def __enter__(self) -> NpyAppender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def npy_layout(path: str | Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, byte offset of the data) from a .npy header, without reading the data; one clear line if
    it is not a .npy."""
    path = Path(path)
    try:
        with open(path, "rb") as file, HEADER_LOCK:
            version = np.lib.format.read_magic(file)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran_order, dtype = read_header(file)
            offset = file.tell()
    except OSError as error:
        raise RetrieverError(f"{path}: cannot read ({error.strerror or error})") from None
    except (ValueError, SyntaxError) as error:
        raise RetrieverError(f"{path}: not a readable .npy file ({error})") from None
    if fortran_order:
        raise RetrieverError(f"{path}: a Fortran-ordered array; save it with numpy's default (C) order")
    return shape, dtype, offset


def read_rows(path: str | Path, start: int, count: int, layout: tuple | None = None) -> np.ndarray:
    """Rows [START, START + COUNT) of a 2-D .npy as float32, with plain file reads: unlike a memory map, nothing
    stays resident afterwards, so streaming through a file of any size keeps the process's memory flat."""
    shape, dtype, offset = layout or npy_layout(path)
    dim = shape[1]
    count = max(0, min(count, shape[0] - start))
    data = np.fromfile(path, dtype=dtype, count=count * dim, offset=offset + start * dim * dtype.itemsize)
    return data.reshape(count, dim).astype(np.float32, copy=False)


def take_rows(path: str | Path, rows: np.ndarray, layout: tuple | None = None) -> np.ndarray:
    """The given rows (ascending) of a 2-D .npy as float32, one positioned read each."""
    shape, dtype, offset = layout or npy_layout(path)
    row_bytes = shape[1] * dtype.itemsize
    out = np.empty((len(rows), shape[1]), dtype=np.float32)
    with open(path, "rb") as file:
        descriptor = file.fileno()
        for position, row in enumerate(np.asarray(rows).tolist()):
            out[position] = np.frombuffer(os.pread(descriptor, row_bytes, offset + row * row_bytes), dtype=dtype)
    return out


class VectorSource:
    """Precomputed vectors: one .npy, or a folder of .npy shards read in file-name order (row i = document i).

    Only headers are read on opening; `blocks()` then maps the data and yields it in bounded row blocks.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            self.shards = sorted(p for p in self.path.iterdir() if p.suffix == ".npy" and p.is_file())
            if not self.shards:
                raise RetrieverError(f"{self.path}: a folder with no .npy shards")
        elif self.path.is_file():
            if self.path.suffix != ".npy":
                raise RetrieverError(f"{self.path}: vectors must be a .npy file or a folder of .npy shards")
            self.shards = [self.path]
        else:
            raise RetrieverError(f"{self.path}: no such file or folder")
        self.rows, dims, self.layouts = 0, set(), []
        for shard in self.shards:
            shape, dtype, offset = npy_layout(shard)
            self.layouts.append((shape, dtype, offset))
            if len(shape) != 2:
                raise RetrieverError(f"{shard}: expected a 2-D matrix (documents x dimensions), got shape {shape}")
            if dtype.kind != "f":
                raise RetrieverError(f"{shard}: expected floating-point vectors, got dtype {dtype}")
            expected = offset + shape[0] * shape[1] * dtype.itemsize
            if shard.stat().st_size < expected:
                raise RetrieverError(f"{shard}: truncated ({shard.stat().st_size} bytes, the header says more)")
            dims.add(shape[1])
            self.rows += shape[0]
        if len(dims) > 1:
            raise RetrieverError(f"{self.path}: shards of different dimensions {sorted(dims)}")
        self.dim = dims.pop()

    def blocks(self, start: int = 0, rows: int = BLOCK_ROWS) -> Iterator[np.ndarray]:
        """float32 blocks of at most ROWS rows, from row START on; a block with NaN or inf is one clear line."""
        offset = 0
        for shard, layout in zip(self.shards, self.layouts):
            length = layout[0][0]
            for first in range(max(0, start - offset), length, rows):
                block = read_rows(shard, first, rows, layout)
                bad = ~np.isfinite(block).all(axis=1)
                if bad.any():
                    row = int(np.flatnonzero(bad)[0])
                    raise RetrieverError(
                        f"{shard}: row {first + row} (document {offset + first + row + 1}) has NaN or infinite values"
                    )
                yield block
            offset += length

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The given rows (ascending, over all shards) as float32."""
        rows = np.asarray(rows, dtype=np.int64)
        parts, offset = [], 0
        for shard, layout in zip(self.shards, self.layouts):
            length = layout[0][0]
            inside = rows[(rows >= offset) & (rows < offset + length)]
            if len(inside):
                parts.append(take_rows(shard, inside - offset, layout))
            offset += length
        return np.concatenate(parts) if parts else np.empty((0, self.dim), np.float32)

    def fingerprint(self) -> list[dict]:
        return [{"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                for p in self.shards]


class ArraySource:
    """Precomputed vectors already in memory (row i = document i), read as `VectorSource` reads files: bounded
    float32 blocks, rows by index, and a check that every value is finite."""

    def __init__(self, vectors: np.ndarray, label: str = "the given vectors"):
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or vectors.dtype.kind != "f":
            raise RetrieverError(f"{label}: expected a 2-D floating-point matrix (documents x dimensions), got "
                                 f"shape {vectors.shape} of {vectors.dtype}")
        self.vectors, self.path = vectors, label
        self.rows, self.dim = vectors.shape

    def blocks(self, start: int = 0, rows: int = BLOCK_ROWS) -> Iterator[np.ndarray]:
        for first in range(start, self.rows, rows):
            block = np.asarray(self.vectors[first : first + rows], dtype=np.float32)
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                row = first + int(np.flatnonzero(bad)[0])
                raise RetrieverError(f"{self.path}: row {row} (document {row + 1}) has NaN or infinite values")
            yield block

    def take(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors[np.asarray(rows, dtype=np.int64)], dtype=np.float32)

    def fingerprint(self) -> None:
        return None  # nothing on disk: a build from memory does not resume


class RowSubset:
    """Some rows of a source (ROWS, ascending positions in it), read as a source of their own: row i is SOURCE's
    row ROWS[i]. A build fits its calibrator on its documents' own vectors this way, among their passages'."""

    def __init__(self, source: VectorSource | ArraySource, rows: np.ndarray):
        self.source, self.positions = source, np.asarray(rows, dtype=np.int64)
        self.rows, self.dim, self.path = len(self.positions), source.dim, source.path

    def blocks(self, start: int = 0, rows: int = BLOCK_ROWS) -> Iterator[np.ndarray]:
        for first in range(start, self.rows, rows):
            yield self.take(np.arange(first, min(first + rows, self.rows)))

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self.source.take(self.positions[np.asarray(rows, dtype=np.int64)])


def vector_source(vectors) -> VectorSource | ArraySource:
    """VECTORS as a source: a .npy file or folder of shards, or an array in memory."""
    return ArraySource(vectors) if isinstance(vectors, np.ndarray) else VectorSource(vectors)

import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.store.arrays import NpyAppender, VectorSource, read_rows, take_rows


def test_appended_rows_are_a_valid_npy_after_every_flush(tmp_path):
    path = tmp_path / "vectors.npy"
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    writer = NpyAppender(path, 4, "float16")
    writer.append(rows[:2])
    writer.flush()
    np.testing.assert_array_equal(np.load(path), rows[:2])
    writer.append(rows[2:])
    writer.close()
    loaded = np.load(path)
    assert loaded.dtype == np.float16 and loaded.shape == (6, 4)
    np.testing.assert_array_equal(loaded, rows)
    np.testing.assert_array_equal(read_rows(path, 4, 10), rows[4:])  # past the end: what is there
    np.testing.assert_array_equal(take_rows(path, np.array([0, 5])), rows[[0, 5]])


def test_resume_cuts_off_rows_after_the_last_recorded_one(tmp_path):
    path = tmp_path / "vectors.npy"
    with NpyAppender(path, 2) as writer:
        writer.append(np.ones((5, 2)))
    with NpyAppender.resume(path, 2, "float32", 3) as writer:  # a killed writer had recorded 3 rows
        writer.append(np.full((1, 2), 7.0))
    np.testing.assert_array_equal(np.load(path), [[1, 1], [1, 1], [1, 1], [7, 7]])
    with pytest.raises(RetrieverError, match="cannot resume"):
        NpyAppender.resume(path, 2, "float32", 9)


def test_one_dimensional_files(tmp_path):
    path = tmp_path / "ids.npy"
    with NpyAppender(path, None, "int64") as writer:
        writer.append(np.array([3, 5]))
        writer.append(np.array([8]))
    assert np.load(path).tolist() == [3, 5, 8]


def test_a_folder_of_shards_reads_in_name_order(tmp_path):
    rows = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)
    folder = tmp_path / "shards"
    folder.mkdir()
    np.save(folder / "part-1.npy", rows[4:].astype(np.float16))
    np.save(folder / "part-0.npy", rows[:4])
    (folder / "README.txt").write_text("not a shard")
    source = VectorSource(folder)
    assert (source.rows, source.dim) == (10, 3)
    blocks = list(source.blocks(rows=3))
    assert [len(block) for block in blocks] == [3, 1, 3, 3]  # blocks never straddle shards
    np.testing.assert_allclose(np.concatenate(blocks), rows, atol=1e-3)
    np.testing.assert_allclose(np.concatenate(list(source.blocks(start=5))), rows[5:], atol=1e-3)
    np.testing.assert_allclose(source.take(np.array([1, 4, 9])), rows[[1, 4, 9]], atol=1e-3)


def test_bad_vector_files_are_one_line_errors(tmp_path):
    np.save(tmp_path / "three_d.npy", np.zeros((2, 2, 2), np.float32))
    np.save(tmp_path / "ints.npy", np.zeros((2, 2), np.int32))
    (tmp_path / "text.npy").write_text("hello")
    with_nan = np.ones((4, 2), np.float32)
    with_nan[2, 1] = np.nan
    np.save(tmp_path / "nan.npy", with_nan)
    np.save(tmp_path / "whole.npy", np.ones((100, 2), np.float32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "whole.npy").read_bytes()[:300])
    shards = tmp_path / "mixed"
    shards.mkdir()
    np.save(shards / "a.npy", np.ones((2, 2), np.float32))
    np.save(shards / "b.npy", np.ones((2, 3), np.float32))
    cases = {
        "three_d.npy": "expected a 2-D matrix",
        "ints.npy": "expected floating-point vectors",
        "text.npy": "not a readable .npy file",
        "cut.npy": "truncated",
        "missing.npy": "no such file or folder",
        "mixed": r"shards of different dimensions \[2, 3\]",
    }
    for name, message in cases.items():
        with pytest.raises(RetrieverError, match=message):
            VectorSource(tmp_path / name)
    with pytest.raises(RetrieverError, match=r"nan.npy: row 2 \(document 3\) has NaN or infinite values"):
        list(VectorSource(tmp_path / "nan.npy").blocks())

"""The engine's GGUF tensor index (engine/models/gguf_index.py) against gguf's own GGUFReader:
the same tensors, in the same order, with the same types, shapes and bytes, on the shipped file
and on a file GGUFWriter writes with every metadata type (nested arrays, string arrays, a
non-default alignment) and tensors in each type the index knows."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from common.default_model import find_gguf
from engine.models.gguf_index import read_tensors


def _assert_same(path):
    ours, reference = read_tensors(path), GGUFReader(str(path)).tensors
    assert [t.name for t in ours] == [t.name for t in reference]
    for a, b in zip(ours, reference, strict=True):
        assert a.tensor_type == int(b.tensor_type), a.name
        assert a.shape == tuple(int(d) for d in reversed(b.shape)), a.name
        expected = np.asarray(b.data)
        got = a.data if expected.dtype == np.uint8 else a.data.view(expected.dtype).reshape(expected.shape)
        assert got.shape == expected.shape and np.array_equal(got, expected), a.name
    return ours


def test_the_shipped_file_reads_as_gguf_reads_it():
    tensors = _assert_same(find_gguf())
    assert {t.tensor_type for t in tensors} >= {3, 8}  # Q4_1 layers, the Q8_0 embedding


@pytest.mark.parametrize("alignment", [32, 64])
def test_a_written_file_with_every_metadata_type(tmp_path, alignment):
    path = tmp_path / "model.gguf"
    writer = GGUFWriter(str(path), "llama")
    if alignment != 32:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 7)
    writer.add_int16("t.i16", -3)
    writer.add_uint64("t.u64", 1 << 40)
    writer.add_float64("t.f64", 0.5)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo")
    writer.add_array("t.strings", ["a", "", "ünïcode", "x" * 300])
    writer.add_array("t.floats", [1.0, 2.5, -3.0])
    writer.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((2, 4, 6)).astype(np.float16))
    q4_1 = rng.integers(0, 256, size=(4, 2 * 20), dtype=np.uint8)  # 4 rows of 64 inputs: 2 blocks of 20 bytes
    writer.add_tensor("q4_1", q4_1, raw_shape=q4_1.shape, raw_dtype=GGMLQuantizationType.Q4_1)
    q8_0 = rng.integers(0, 256, size=(3, 34), dtype=np.uint8)
    writer.add_tensor("q8_0", q8_0, raw_shape=q8_0.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors = {t.name: t for t in _assert_same(path)}
    assert tensors["q4_1"].shape == (4, 64) and tensors["q8_0"].shape == (3, 32)
    assert np.array_equal(tensors["q4_1"].data, q4_1)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "not.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_tensors(path)

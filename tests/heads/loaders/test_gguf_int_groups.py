"""GGUF blocks as integer groups (heads.loaders.gguf_int_groups): exactly gguf's own dequantised
values, on random blocks of every supported type (any bit pattern is a block; only the fp16
scales are kept finite)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from heads.loaders.gguf_int_groups import int_groups

# bytes per block and values per block; where the block's fp16 scales sit
LAYOUT = {T.Q8_0: (34, 32, (0,)), T.Q5_0: (22, 32, (0,)), T.Q4_K: (144, 256, (0, 2))}


def _random_blocks(qtype: T, rows: int, k: int, seed: int) -> np.ndarray:
    size, per, scale_at = LAYOUT[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, k // per, size), dtype=np.uint8)
    for at in scale_at:
        d = (rng.random((rows, k // per)) * 0.01).astype(np.float16)
        raw[..., at:at + 2] = d.view(np.uint8).reshape(rows, k // per, 2)
    return raw.reshape(rows, k // per * size)


@pytest.mark.parametrize("qtype", list(LAYOUT))
def test_groups_dequantise_to_gguf_values(qtype) -> None:
    raw = _random_blocks(qtype, 7, 512, seed=int(qtype))
    want = np.asarray(dequantize(raw, qtype), dtype=np.float32)
    g = int_groups(raw, qtype, want)
    assert g is not None and g.shape == (7, 512)
    assert (g.offsets is not None) == (qtype == T.Q4_K)
    assert g.bits == {T.Q8_0: 8, T.Q5_0: 5, T.Q4_K: 4}[qtype]
    np.testing.assert_array_equal(g.dequantize().numpy(), want)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0])
def test_q8_0_and_q5_0_keep_the_file_bytes(qtype) -> None:
    raw = _random_blocks(qtype, 3, 64, seed=1)
    g = int_groups(raw, qtype, np.asarray(dequantize(raw, qtype), dtype=np.float32))
    assert g is not None and g.nbytes == raw.nbytes  # the values at their width + fp16 scale


def test_q4_k_reads_six_bits_a_value() -> None:
    raw = _random_blocks(T.Q4_K, 2, 256, seed=2)
    g = int_groups(raw, T.Q4_K, np.asarray(dequantize(raw, T.Q4_K), dtype=np.float32))
    assert g is not None and g.nbytes == 2 * 256 * 6 // 8  # nibbles + fp32 scale and offset


def test_types_without_an_integer_form() -> None:
    raw = np.zeros((2, 210), dtype=np.uint8)  # one Q6_K block per row
    assert int_groups(raw, T.Q6_K, np.zeros((2, 256), np.float32)) is None

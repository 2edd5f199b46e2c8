"""Int8 groups (kernels.int8_groups) as a container, and the weights choice per batch
(kernels.precision)."""

from __future__ import annotations

import pytest
import torch

from kernels import onednn_gemm, precision
from kernels.int8_groups import GROUP, Int8Groups
from kernels.packed_rows import RowPacker, packing_supported


def _groups(n: int, k: int, offsets: bool = False, seed: int = 0) -> Int8Groups:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 0.01).half()
    off = torch.randn(n, k // GROUP, generator=gen) * 0.01 if offsets else None
    return Int8Groups(values, scales, off)


def test_dequantize_is_scale_times_value_plus_offset() -> None:
    g = _groups(3, 64, offsets=True)
    w = g.dequantize()
    assert w.shape == (3, 64)
    assert float(w[1, 40]) == pytest.approx(
        float(g.scales[1, 1]) * int(g.values[1, 40]) + float(g.offsets[1, 1]), rel=1e-6)


def test_rows_take_and_cat_keep_each_row_with_its_scales() -> None:
    a, b = _groups(10, 64), _groups(4, 64, offsets=True, seed=1)
    torch.testing.assert_close(a.rows(2, 5).dequantize(), a.dequantize()[2:5])
    index = torch.tensor([9, 0, 3])
    torch.testing.assert_close(a.take(index).dequantize(), a.dequantize()[index])
    both = Int8Groups.cat([a, b])
    assert both.scales.dtype == torch.float16 and both.offsets is not None
    torch.testing.assert_close(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="share K"):
        Int8Groups.cat([a, _groups(2, 32)])


def test_tensors_round_trip_by_name() -> None:
    g, h = _groups(5, 32), _groups(6, 64, offsets=True)
    flat = {**g.to_tensors("a.weight"), **h.to_tensors("b")}
    back = Int8Groups.from_tensors(flat)
    assert sorted(back) == ["a.weight", "b"] and back["a.weight"].offsets is None
    torch.testing.assert_close(back["b"].dequantize(), h.dequantize())


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        Int8Groups(torch.zeros(2, 40, dtype=torch.int8), torch.zeros(2, 1).half())
    with pytest.raises(ValueError, match="scales"):
        Int8Groups(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 3).half())
    with pytest.raises(ValueError, match="offsets"):
        Int8Groups(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 2).half(),
                   torch.zeros(2, 2).half())


@pytest.mark.skipif(not packing_supported(torch.zeros(1, dtype=torch.bfloat16)),
                    reason="no oneDNN bf16 GEMM")
def test_packed_rows_read_int8_up_to_the_bound_and_bf16_above() -> None:
    g = _groups(40000, 64, seed=2)  # three 16k blocks, the last one short
    dense = g.dequantize(torch.bfloat16)
    rows = RowPacker(int8_rows=2).pack(dense, g)
    plain = RowPacker().pack(dense)
    for b in (1, 2, 3, 8):
        h = torch.randn(b, 64).to(torch.bfloat16)
        got = rows.logits(h)
        if b > 2:  # the bf16 product of the rounded weights, exactly as without int8 rows
            torch.testing.assert_close(got, plain.logits(h), rtol=0, atol=0)
        else:  # the file's exact values: within one bf16 rounding of the exact product
            want = h.float() @ g.dequantize().T
            torch.testing.assert_close(got, want, rtol=2.0**-7, atol=1e-3)


def test_pack_refuses_groups_of_another_shape() -> None:
    with pytest.raises(ValueError, match="int8 groups"):
        onednn_gemm.pack(torch.zeros(4, 64), "torch", _groups(5, 64), int8_rows=1)


def test_int8_rows_per_policy() -> None:
    assert precision.int8_rows("bf16", 4) == 0
    assert precision.int8_rows("quantized", 1) == precision.EVERY_BATCH
    assert precision.int8_rows("auto", 3) == 3
    assert precision.int8_rows("auto", None) == precision.DEFAULT_INT8_ROWS
    with pytest.raises(ValueError, match="weights"):
        precision.int8_rows("int4", None)


def test_crossover_is_the_last_size_of_an_unbroken_int8_win() -> None:
    bs = [1, 2, 3, 4, 6]
    assert precision.crossover(bs, [1, 1, 1, 2, 1], [2, 2, 2, 2, 2]) == 3  # b=4 is a tie
    assert precision.crossover(bs, [3] * 5, [2] * 5) == 0
    assert precision.crossover(bs, [1] * 5, [2] * 5) == 6


def test_sweep_records_both_products_and_the_choice() -> None:
    entry = precision.sweep(2048, 64, bs=(1, 2), repeats=1)
    assert entry["b"] == [1, 2] and len(entry["t_int8_s"]) == len(entry["t_bf16_s"]) == 2
    assert entry["int8_bytes"] < entry["bf16_bytes"]
    assert entry["int8_rows"] in (0, 1, 2)

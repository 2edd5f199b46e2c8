"""Integer groups (kernels.int_groups) as a container, and the weights choice per batch
(kernels.precision)."""

from __future__ import annotations

import pytest
import torch

from kernels import onednn_gemm, precision
from kernels.int_groups import GROUP, IntGroups
from kernels.packed_rows import RowPacker, packing_supported

_RANGE = {8: (-127, 128), 5: (-16, 16), 4: (0, 16)}


def _groups(n: int, k: int, offsets: bool = False, seed: int = 0, bits: int = 8) -> IntGroups:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(*_RANGE[bits], (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 0.01).half()
    off = torch.randn(n, k // GROUP, generator=gen) * 0.01 if offsets else None
    return IntGroups.pack(values, scales, off, bits)


@pytest.mark.parametrize("bits", [5, 4])
def test_packing_keeps_every_value_in_the_files_bytes(bits) -> None:
    gen = torch.Generator().manual_seed(bits)
    q = torch.randint(*_RANGE[bits], (7, 96), dtype=torch.int8, generator=gen)
    g = IntGroups.pack(q, torch.ones(7, 3).half(), bits=bits)
    assert torch.equal(g.q(), q) and g.shape == (7, 96)
    # 16 bytes of nibbles per 32 values (+ 4 of fifth bits) + the fp16 scale: Q5_0's 22 bytes
    assert g.nbytes == 7 * 3 * (16 + (4 if bits == 5 else 0) + 2)
    # the file's layout: byte j of a group holds value j (low nibble) and value j + 16 (high)
    u = (q.to(torch.int16) + (16 if bits == 5 else 0))
    assert int(g.values[2, 17]) == int(u[2, 33] & 15) | (int(u[2, 49] & 15) << 4)
    if bits == 5:  # value j's fifth bit: byte j // 8 of the group's mask, bit j % 8
        assert (int(g.high[2, 4 + 17 // 8]) >> (17 % 8)) & 1 == int(u[2, 32 + 17] >> 4)
    with pytest.raises(ValueError, match="must lie in"):
        IntGroups.pack(q + 16, torch.ones(7, 3).half(), bits=bits)


def test_packed_groups_slice_gather_stack_and_round_trip() -> None:
    five, four, eight = _groups(6, 64, bits=5), _groups(3, 64, True, 1, 4), _groups(2, 64)
    torch.testing.assert_close(five.rows(1, 4).dequantize(), five.dequantize()[1:4])
    index = torch.tensor([5, 0, 2])
    torch.testing.assert_close(five.take(index).dequantize(), five.dequantize()[index])
    same = IntGroups.cat([five, five.rows(0, 2)])
    assert same.bits == 5 and same.shape == (8, 64)
    mixed = IntGroups.cat([five, four, eight])  # widths differ: widened to int8
    assert mixed.bits == 8 and mixed.offsets is not None
    torch.testing.assert_close(mixed.dequantize(), torch.cat(
        [five.dequantize(), four.dequantize(), eight.dequantize()]))
    back = IntGroups.from_tensors({**five.to_tensors("a"), **four.to_tensors("b")})
    assert (back["a"].bits, back["b"].bits) == (5, 4)
    torch.testing.assert_close(back["a"].dequantize(), five.dequantize())
    torch.testing.assert_close(back["b"].dequantize(), four.dequantize())


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
    both = IntGroups.cat([a, b])
    assert both.scales.dtype == torch.float16 and both.offsets is not None
    torch.testing.assert_close(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="share K"):
        IntGroups.cat([a, _groups(2, 32)])


def test_tensors_round_trip_by_name() -> None:
    g, h = _groups(5, 32), _groups(6, 64, offsets=True)
    flat = {**g.to_tensors("a.weight"), **h.to_tensors("b")}
    back = IntGroups.from_tensors(flat)
    assert sorted(back) == ["a.weight", "b"] and back["a.weight"].offsets is None
    torch.testing.assert_close(back["b"].dequantize(), h.dequantize())


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        IntGroups(torch.zeros(2, 40, dtype=torch.int8), torch.zeros(2, 1).half())
    with pytest.raises(ValueError, match="scales"):
        IntGroups(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 3).half())
    with pytest.raises(ValueError, match="offsets"):
        IntGroups(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 2).half(),
                  torch.zeros(2, 2).half())
    with pytest.raises(ValueError, match="need high"):
        IntGroups(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 2).half(), bits=5)
    with pytest.raises(ValueError, match="4-bit values"):
        IntGroups(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 2).half(), bits=4)


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
        else:  # the file's exact values: within one bf16 rounding of the exact product, plus
            # the activations' quantisation (int8 per group of 32 at worst: 1/254 of its max)
            w = g.dequantize()
            want = h.float() @ w.T
            xmax = h.float().abs().view(b, -1, GROUP).amax(-1, keepdim=True)
            bound = (xmax.expand(b, 64 // GROUP, GROUP).reshape(b, 64) @ w.abs().T) * 2.0**-7
            assert bool(((got - want).abs() <= want.abs() * 2.0**-7 + bound + 1e-5).all())


@pytest.mark.skipif(not packing_supported(torch.zeros(1, dtype=torch.bfloat16)),
                    reason="no oneDNN bf16 GEMM")
def test_rows_as_reads_the_bytes_of_a_smaller_product_row_by_row() -> None:
    # A verify multiplies several rows per sequence: under rows_as(1) each row gets what a
    # one-row product gives it, the integer groups' product, not bf16's: equal but for the
    # last bf16 rounding of a few fp32 sums taken in another order.
    g = _groups(3000, 64, seed=4)
    rows = RowPacker(int8_rows=1).pack(g.dequantize(torch.bfloat16), g)
    h = torch.randn(6, 64).to(torch.bfloat16)
    alone = torch.cat([rows.logits(h[i:i + 1]) for i in range(6)])
    with onednn_gemm.rows_as(1):
        together = rows.logits(h)
    ulp = alone.float().abs() * 2.0**-7 + 1e-6  # one bf16 rounding
    off = (together.float() - alone.float()).abs()
    assert bool((off <= ulp).all()) and float((off > 0).float().mean()) < 0.01
    plain = (rows.logits(h).float() - alone.float()).abs()  # outside it: bf16 for six rows
    assert float((plain > 0).float().mean()) > 0.1


def test_pack_refuses_groups_of_another_shape() -> None:
    with pytest.raises(ValueError, match="int groups"):
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

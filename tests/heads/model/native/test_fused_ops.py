"""The fused C++ CPU ops (heads/model/native/fused_ops.cpp) against the eager torch ops they
replace, in fp32 and bf16, on odd shapes.

Tolerances. fp32: the ops sum in a different order than torch (16 lanes), so results differ
by a few fp32 ulps (1e-5 relative here). bf16: both sides compute in fp32 and round to bf16 at
the same points, so a result may differ only where an fp32 difference of a few ulps crosses
a bf16 rounding boundary: one bf16 ulp (at most 2^-7 of the value) on the values it touches. Decode
attention is checked against fp32 attention over the same bf16 inputs: the op rounds once, at
the end, so it is within half a bf16 ulp of that (plus fp32 noise).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from heads.model.attention import AttentionMetadata, decode_attention, write_kv
from heads.model.llama import apply_rope
from heads.model.native import build

BF16_ULP = 2.0**-7  # largest spacing of bf16 values relative to them (8 significant bits)
DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module")
def ops() -> object:
    # A failed build fails here: CI machines have the compiler `make install` builds with.
    assert build.load(), "fused CPU ops did not build"
    return torch.ops.polyhead


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    rtol = 1e-5 if dtype == torch.float32 else BF16_ULP
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=1e-6)


def _eager_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # GemmaRMSNorm's eager formula, w already (1 + weight) in fp32
    return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 40), (7, 33), (3, 5, 6), (0, 8)])
def test_rms_norm(ops, dtype, shape) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    w = torch.randn(shape[-1], generator=gen) + 1
    _close(ops.rms_norm(x, w, 1e-6), _eager_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 640), (5, 37), (16, 96)])
def test_add_rms_norm(ops, dtype, rows, width) -> None:
    gen = torch.Generator().manual_seed(1)
    residual = (torch.randn(rows, width, generator=gen) * 10).to(dtype)
    update = torch.randn(rows, width, generator=gen).to(dtype)
    post, pre = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
    want_res = residual + _eager_norm(update, post, 1e-6)
    want = _eager_norm(want_res, pre, 1e-6)
    got = ops.add_rms_norm(residual, update, post, pre, 1e-6)  # updates residual in place
    _close(residual, want_res, dtype)
    _close(got, _eager_norm(residual, pre, 1e-6), dtype)  # exactly the norm of what it stored
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inner", [(1, 2048), (5, 37), (0, 4)])
def test_gelu_tanh_mul(ops, dtype, rows, inner) -> None:
    gen = torch.Generator().manual_seed(5)
    gate_up = (torch.randn(rows, 2 * inner, generator=gen) * 4).to(dtype)
    gate, up = gate_up.split(inner, dim=-1)
    _close(ops.gelu_tanh_mul(gate_up), F.gelu(gate, approximate="tanh") * up, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,heads,kv_heads,head_dim", [(1, 4, 1, 256), (6, 6, 2, 10),
                                                       (3, 3, 3, 18)])
def test_qk_norm_rope_writes_the_cache(ops, dtype, t, heads, kv_heads, head_dim) -> None:
    gen = torch.Generator().manual_seed(2)
    qkv = (torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=gen) * 2).to(dtype)
    qw, kw = torch.randn(head_dim, generator=gen) + 1, torch.randn(head_dim, generator=gen) + 1
    angles = torch.rand(t, 1, head_dim // 2, generator=gen) * 6
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    blocks, bs = 5, 3
    slots = torch.randperm(blocks * bs, generator=gen)[:t]
    k_cache = torch.zeros(blocks, bs, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    q, k, v = ops.qk_norm_rope(qkv, qw, kw, cos, sin, 1e-6, heads, kv_heads, k_cache, v_cache,
                               slots)

    eq, ek, ev = qkv.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    want_q = apply_rope(_eager_norm(eq.reshape(t, heads, head_dim), qw, 1e-6), cos, sin)
    want_k = apply_rope(_eager_norm(ek.reshape(t, kv_heads, head_dim), kw, 1e-6), cos, sin)
    want_v = ev.reshape(t, kv_heads, head_dim)
    _close(q, want_q, dtype)
    _close(k, want_k, dtype)
    assert torch.equal(v, want_v)
    want_kc, want_vc = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    write_kv(want_kc, want_vc, k, v, slots)
    assert torch.equal(k_cache, want_kc) and torch.equal(v_cache, want_vc)


def _reference_attention(q, k_cache, v_cache, tables, lens, window, scale) -> torch.Tensor:
    # fp32 attention per sequence over its keys gathered by position: [B, H, Dh] fp32
    b, h, dh = q.shape
    bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(b, h, dh)
    for i in range(b):
        n = int(lens[i])
        first = max(0, n - window) if window else 0
        pos = torch.arange(first, n)
        slots = tables[i][pos // bs] * bs + pos % bs
        k = k_cache.view(-1, kv_heads, dh)[slots].float()  # [L, K, Dh]
        v = v_cache.view(-1, kv_heads, dh)[slots].float()
        for j in range(h):
            g = j // (h // kv_heads)
            p = torch.softmax(k[:, g] @ q[i, j].float() * scale, dim=0)
            out[i, j] = p @ v[:, g]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 1, 256), (6, 2, 10), (3, 3, 17)])
def test_paged_decode_attention(ops, dtype, window, heads, kv_heads, head_dim) -> None:
    gen = torch.Generator().manual_seed(3)
    blocks, bs, b = 12, 4, 3
    k_cache = torch.randn(blocks, bs, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(blocks, bs, kv_heads, head_dim, generator=gen).to(dtype)
    q = (torch.randn(b, heads, head_dim, generator=gen) * 2).to(dtype)
    tables = torch.stack([torch.randperm(blocks, generator=gen)[:4] for _ in range(b)])
    lens = torch.tensor([1, 9, 16])  # one key, a block edge, a full table
    scale = head_dim**-0.5
    got = ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, window, scale)
    want = _reference_attention(q, k_cache, v_cache, tables, lens, window, scale)
    assert got.dtype == dtype
    rtol = 1e-5 if dtype == torch.float32 else BF16_ULP / 2 + 1e-5
    torch.testing.assert_close(got.float(), want, rtol=rtol, atol=1e-5)
    # The eager path the op replaces agrees with the same reference.
    meta = AttentionMetadata.decode(torch.zeros(b, dtype=torch.int64), tables, lens)
    lmax, mask = meta.decode_mask(window or None)
    eager = decode_attention(q, k_cache, v_cache, tables, lmax, mask, scale)
    torch.testing.assert_close(eager.float(), want, rtol=2 * BF16_ULP, atol=1e-2
                               if dtype == torch.bfloat16 else 1e-5)


def test_bad_inputs_are_refused(ops) -> None:
    x = torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        ops.rms_norm(x.double(), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="fp32 \\[8\\] weight"):
        ops.rms_norm(x, torch.ones(7), 1e-6)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(RuntimeError, match="slot out of range"):
        ops.qk_norm_rope(torch.randn(1, 24), torch.ones(8), torch.ones(8), torch.ones(1, 1, 8),
                         torch.zeros(1, 1, 8), 1e-6, 1, 1, cache, cache.clone(),
                         torch.tensor([8]))
    q = torch.randn(1, 1, 8)
    with pytest.raises(RuntimeError, match="longer than its block table"):
        ops.paged_decode_attention(q, cache, cache, torch.tensor([[0]]), torch.tensor([5]), 0, 1.0)
    with pytest.raises(RuntimeError, match="block id out of range"):
        ops.paged_decode_attention(q, cache, cache, torch.tensor([[2]]), torch.tensor([3]), 0, 1.0)


def _has_gemv(ops: object) -> bool:
    return hasattr(ops, "gemv_bf16")


def _cpu_has_avx512_bf16() -> bool:
    return "avx512_bf16" in build.cpu_flags().split()


@pytest.mark.parametrize("b", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(1, 32), (3, 64), (37, 640), (1001, 2048), (16387, 640)])
def test_gemv_bf16(ops, b, n, k) -> None:
    """The streaming GEMV against the fp32 product of the same bf16 inputs: both sum in fp32
    (in different orders) and round once, so within one bf16 ulp of the value, plus the fp32
    summation noise where terms cancel (about k x 2^-24 of the terms' size)."""
    if not _has_gemv(ops):
        assert not _cpu_has_avx512_bf16(), "built for an AVX512-BF16 CPU without its GEMV"
        pytest.skip("no AVX512-BF16 on this CPU")
    gen = torch.Generator().manual_seed(n * k + b)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(b, k, generator=gen).to(torch.bfloat16)
    got = ops.gemv_bf16(x, w)
    want = x.float() @ w.float().T
    assert got.dtype == torch.bfloat16 and got.shape == (b, n)
    torch.testing.assert_close(got.float(), want, rtol=BF16_ULP, atol=k * 2.0**-20)


def test_gemv_bf16_refuses_what_it_cannot_stream(ops) -> None:
    if not _has_gemv(ops):
        pytest.skip("no AVX512-BF16 on this CPU")
    w = torch.randn(8, 64).to(torch.bfloat16)
    for x in (torch.randn(5, 64).to(torch.bfloat16), torch.randn(1, 64),
              torch.randn(1, 48).to(torch.bfloat16)):
        with pytest.raises(RuntimeError, match="gemv_bf16"):
            ops.gemv_bf16(x, w if x.shape[1] == 64 else w[:, :48].contiguous())


def test_the_build_is_keyed_by_source_and_machine() -> None:
    key = build.build_key()
    assert len(key) == 16 and key == build.build_key()
    assert build.cpu_flags()  # /proc/cpuinfo here; the machine name elsewhere

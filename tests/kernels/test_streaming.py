"""Streaming paths (chunked torch; fused Triton in the interpreter or natively on CUDA) against
the reference: greedy, logprobs, top-k membership, χ², seeded equivalence, edge cases.

The Triton interpreter is slow (~0.5 s per launch here), so its shapes stay at V <= 8k,
d <= 512 and each check is one or two launches.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402
from scipy import stats  # noqa: E402

from kernels import chunked, reference, rng, split  # noqa: E402
from kernels.packed_rows import RowPacker, packing_supported  # noqa: E402
from kernels.row_params import RowParams
from kernels.sampling_params import SamplingBatch  # noqa: E402
from kernels.streaming import near_tie_tolerance  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _triton(dev: str):  # type: ignore[no-untyped-def]
    from kernels import triton_fused

    return triton_fused.unembed_and_sample


IMPLS = [
    pytest.param("chunked", "cpu", id="chunked"),
    pytest.param("packed", "cpu", id="chunked-packed"),
    pytest.param("triton", "cpu", id="triton-interp",
                 marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1")),
    pytest.param("triton", "cuda", id="triton-cuda", marks=pytest.mark.gpu),
]
DTYPES = [torch.float32, torch.bfloat16]

ROW_MIX = [
    RowParams(temperature=0.0),
    RowParams(temperature=0.7, seed=11),
    RowParams(temperature=1.0, top_k=5, seed=12),
    RowParams(temperature=1.3, top_p=0.9, seed=13),
    RowParams(temperature=0.5, top_k=50, top_p=0.8, seed=14),
    RowParams(temperature=1.0, top_k=1, seed=15),
    RowParams(temperature=2.0, top_p=0.3, seed=16),
]


def _packed(h, w, b, bias=None):  # type: ignore[no-untyped-def]
    # Blocks of 2560 rows read in chunks of 1024: chunks that straddle a block boundary too.
    if not packing_supported(w):
        pytest.skip("oneDNN packs fp32 CPU rows only")
    packed = RowPacker(block_rows=2560).pack(w)
    return chunked.unembed_and_sample(h, w, b, bias, chunk=1024, packed=packed)


def _impl(name: str, dev: str):  # type: ignore[no-untyped-def]
    if name == "chunked":
        return lambda h, w, b, bias=None: chunked.unembed_and_sample(h, w, b, bias, chunk=1024)
    if name == "packed":
        return _packed
    return _triton(dev)


def _data(b: int, vocab: int, d: int, dtype: torch.dtype, dev: str, seed: int = 0,
          spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(vocab + 77, d, generator=g) / d**0.5
    w = shared.to(dtype)[:vocab]  # a row prefix of a larger (nested-head) matrix
    h = (torch.randn(b, d, generator=g) * spread).to(dtype)
    return h.to(dev), w.to(dev)


def _scores(h: torch.Tensor, w: torch.Tensor, batch: SamplingBatch, bias=None) -> torch.Tensor:
    """Exact (float64) per-row scores: ℓ for greedy rows, ℓ/T + g for sampled rows."""
    logits = h.double().cpu() @ w.double().cpu().T
    if bias is not None:
        logits = logits + bias.double().cpu()
    t = batch.temperature.double()
    noise = rng.gumbel(batch.seed, batch.position, w.shape[0]).double()
    return torch.where(t[:, None] > 0, logits / t.clamp_min(1e-30)[:, None] + noise, logits)


def _out_dtype(impl: str, dtype: torch.dtype) -> torch.dtype:
    """Packed bf16 rows round each logit to bf16 (oneDNN's output); every other path keeps
    fp32 logits."""
    return torch.bfloat16 if impl == "packed" and dtype == torch.bfloat16 else torch.float32


def assert_same_or_near_tie(a: torch.Tensor, b: torch.Tensor, h, w, batch, bias=None,
                            out_dtype: torch.dtype = torch.float32) -> int:
    """Tokens a and b agree, or their exact scores differ by at most the near-tie tolerance.
    Returns the number of near-ties."""
    a, b = a.cpu(), b.cpu()
    diff = torch.nonzero(a != b).squeeze(1)
    if diff.numel() == 0:
        return 0
    s = _scores(h, w, batch, bias)
    tol = near_tie_tolerance(h.cpu(), w.cpu(), batch.temperature, out_dtype)
    gap = (s[diff, a[diff]] - s[diff, b[diff]]).abs()
    assert bool((gap <= tol[diff]).all()), (diff.tolist(), gap.tolist(), tol[diff].tolist())
    return int(diff.numel())


@pytest.mark.parametrize("impl,dev", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_matches_argmax(impl: str, dev: str, dtype: torch.dtype) -> None:
    h, w = _data(33, 5003, 320, dtype, dev)  # b crosses a BLOCK_B; V and d off the tile grid
    batch = SamplingBatch.from_rows([RowParams(temperature=0.0)] * 33, list(range(33)))
    out = _impl(impl, dev)(h, w, batch)
    want = torch.argmax(h.float() @ w.float().T, dim=1)
    assert_same_or_near_tie(out.token_ids, want, h, w, batch, out_dtype=_out_dtype(impl, dtype))


@pytest.mark.parametrize("impl,dev", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_rows_logprobs_and_seeded_equivalence(impl: str, dev: str, dtype) -> None:
    rows = ROW_MIX * 2
    h, w = _data(len(rows), 8000, 512, dtype, dev, seed=1)
    batch = SamplingBatch.from_rows(rows, [5] * 7 + [6] * 7, want_logprobs=True)
    out = _impl(impl, dev)(h, w, batch)
    ref = reference.unembed_and_sample(h.cpu(), w.cpu(), batch)
    rounding = _out_dtype(impl, dtype)
    assert_same_or_near_tie(out.token_ids, ref.token_ids, h, w, batch, out_dtype=rounding)
    exact = h.double().cpu() @ w.double().cpu().T
    lp = torch.log_softmax(exact, dim=1)
    want = lp.gather(1, out.token_ids.cpu()[:, None]).squeeze(1)
    # bf16-rounded logits (8 significant bits) move the log-sum-exp by <= 2^-8 max|logit|
    atol = 1e-4 if rounding == torch.float32 else 1e-4 + 2.0**-8 * float(exact.abs().max())
    assert torch.allclose(out.logprobs.cpu().double(), want, atol=atol)
    spl = split.unembed_and_sample(h, w, batch)  # the other path, same seeds
    assert_same_or_near_tie(out.token_ids, spl.token_ids, h, w, batch, out_dtype=rounding)


@pytest.mark.parametrize("impl,dev", IMPLS)
def test_top_k_membership(impl: str, dev: str) -> None:
    rows = [RowParams(temperature=1.5, top_k=k, seed=s) for s in range(8) for k in (3, 40)]
    h, w = _data(1, 4099, 128, torch.float32, dev, seed=2)
    h = h.expand(len(rows), -1).contiguous()
    batch = SamplingBatch.from_rows(rows, [9] * len(rows))
    out = _impl(impl, dev)(h, w, batch).token_ids.cpu()
    order = torch.argsort(h[0].cpu() @ w.cpu().T, descending=True, stable=True)
    for r, tok in zip(rows, out.tolist(), strict=True):
        assert tok in set(order[: r.top_k].tolist())


@pytest.mark.parametrize("impl,dev", IMPLS)
@pytest.mark.parametrize("top_k", [0, 10])
def test_chi_square_against_softmax(impl: str, dev: str, top_k: int) -> None:
    n, vocab, temp = 3000, 300, 0.8
    h, w = _data(1, vocab, 64, torch.float32, dev, seed=3, spread=1.0)
    h = h.expand(n, -1).contiguous()
    rows = [RowParams(temperature=temp, top_k=top_k, seed=i) for i in range(n)]
    batch = SamplingBatch.from_rows(rows, [i % 7 for i in range(n)])
    toks = _impl(impl, dev)(h, w, batch).token_ids.cpu()
    logits = (h[0].double().cpu() @ w.double().cpu().T) / temp
    if top_k:
        logits[torch.argsort(logits, descending=True)[top_k:]] = float("-inf")
    p = torch.softmax(logits, 0)
    counts = torch.bincount(toks, minlength=vocab).double()
    expected = p * n
    big = expected >= 5  # pool the tail into one cell so every expected count is >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert float(counts[p == 0].sum()) == 0
    assert stats.chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("impl,dev", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_cases(impl: str, dev: str, dtype: torch.dtype) -> None:
    vocab, d = 1031, 64
    h, w = _data(6, vocab, d, dtype, dev, seed=4)
    h[3] = 0  # all logits equal: greedy -> id 0, sampling -> argmax of the noise
    h[4] = 0
    rows = [RowParams(temperature=1e-6, seed=1),  # T -> 0: greedy up to near-ties
            RowParams(temperature=1.0, top_p=1.0, top_k=0, seed=2),  # filters off
            RowParams(temperature=0.9, top_k=vocab, seed=3),  # top_k >= V is off
            RowParams(temperature=0.0), RowParams(temperature=1.0, seed=5),
            RowParams(temperature=1.0, top_k=7, seed=6)]
    bias = torch.zeros(6, vocab)
    bias[:, ::3] = float("-inf")  # banned tokens (an additive -inf mask)
    bias[5, :] = float("-inf")
    bias[5, 100:104] = 0.0  # fewer allowed tokens than top_k
    batch = SamplingBatch.from_rows(rows, [3] * 6, want_logprobs=True)
    out = _impl(impl, dev)(h, w, batch, bias.to(dev))
    ref = reference.unembed_and_sample(h.cpu(), w.cpu(), batch, bias)
    rounding = _out_dtype(impl, dtype)
    assert_same_or_near_tie(out.token_ids, ref.token_ids, h, w, batch, bias, rounding)
    assert int(out.token_ids[3]) == 1  # id 0 is banned: the lowest allowed id
    assert bool((out.token_ids.cpu() % 3 != 0).all())
    assert 100 <= int(out.token_ids[5]) < 104
    # bf16-rounded logits (8 significant bits) move the log-sum-exp by <= 2^-8 max|logit|
    atol = 1e-4 if rounding == torch.float32 else 1e-4 + 2.0**-8 * float(
        (h.float().cpu() @ w.float().cpu().T).abs().max())
    torch.testing.assert_close(out.logprobs.cpu(), ref.logprobs, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("impl,dev", IMPLS)
def test_top_p_beyond_the_candidates_falls_back_exactly(impl: str, dev: str) -> None:
    h, w = _data(2, 2000, 64, torch.float32, dev, seed=5, spread=0.01)  # nearly flat
    rows = [RowParams(temperature=1.0, top_p=0.9, seed=1), RowParams(temperature=1.0, seed=2)]
    batch = SamplingBatch.from_rows(rows, [0, 0])
    out = _impl(impl, dev)(h, w, batch)
    ref = reference.unembed_and_sample(h.cpu(), w.cpu(), batch)
    assert out.token_ids.cpu().tolist() == ref.token_ids.tolist()


@pytest.mark.parametrize("dev", [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="no interpreter")),
    pytest.param("cuda", marks=pytest.mark.gpu),
])
def test_triton_split_sampler_matches_reference_sampler(dev: str) -> None:
    from kernels.triton_fused import sample_logits

    h, w = _data(len(ROW_MIX), 5003, 128, torch.float32, dev, seed=6)
    batch = SamplingBatch.from_rows(ROW_MIX, [2] * len(ROW_MIX), want_logprobs=True)
    logits = h.float() @ w.float().T
    out = sample_logits(logits, batch)
    ref = reference.sample_from_logits(logits.cpu(), batch)
    assert out.token_ids.cpu().tolist() == ref.token_ids.tolist()  # same logits: no ties
    torch.testing.assert_close(out.logprobs.cpu(), ref.logprobs, atol=1e-5, rtol=1e-5)


def test_near_tie_tolerance_covers_summation_order() -> None:
    h, w = _data(4, 3000, 512, torch.float32, "cpu", seed=7)
    fwd = h @ w.T
    rev = (h.flip(1) @ w.flip(1).T)  # another summation order
    tol = near_tie_tolerance(h, w, torch.zeros(4))
    assert bool(((fwd - rev).abs().max(dim=1).values * 2 <= tol).all())
    # and it stays small next to the logits' spread: it excuses ties, not bugs
    assert float(tol.max()) < 0.01 * float(fwd.std())

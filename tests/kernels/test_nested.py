"""The nested pass (one read of the largest head's rows for a mixed-head batch) against the
per-group path it replaces: every row the same token (up to fp32 near-ties, as between any two
paths), logprob and seeded sample as its own head's op on weight[:V_i]; and a χ² test.

The Triton interpreter is slow, so its shapes stay at V <= 8k, d <= 512.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402
from scipy import stats  # noqa: E402

from kernels import chunked, nested, reference, split  # noqa: E402
from kernels.errors import ShapeMismatch  # noqa: E402
from kernels.packed_rows import RowPacker, packing_supported  # noqa: E402
from kernels.row_groups import take_rows  # noqa: E402
from kernels.row_params import RowParams  # noqa: E402
from kernels.sampling_params import SampleOutput, SamplingBatch  # noqa: E402
from tests.kernels.test_streaming import ROW_MIX, assert_same_or_near_tie  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 1024  # packed block rows in these tests: head ends fall inside and on block edges

# (nested kernel, how each group runs per head, device)
PATHS = [
    pytest.param("split", "split", "cpu", id="split"),
    pytest.param("split", "split-packed", "cpu", id="split-packed"),
    pytest.param("chunked", "chunked", "cpu", id="chunked"),
    pytest.param("chunked", "chunked-packed", "cpu", id="chunked-packed"),
    pytest.param("fused", "fused", "cpu", id="triton-interp",
                 marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1")),
    pytest.param("fused", "fused", "cuda", id="triton-cuda", marks=pytest.mark.gpu),
]

# Row V mixes over a 7001-row matrix: head ends off every chunk and block edge, on one, all
# rows on one head, rows on the largest head only, and heads interleaved in the batch.
MIXES = {
    "two-heads": [7001, 3001, 7001, 3001, 3001, 7001, 3001],
    "three-heads-interleaved": [2048, 7001, 1500, 7001, 2048, 1500, 2048, 7001, 1500],
    "all-one-small-head": [3001] * 5,
    "all-largest": [7001] * 4,
    "one-big-many-small": [7001] + [1024] * 8,
    "single-row": [4500],
}


def _data(b: int, vocab: int, d: int, seed: int, spread: float = 3.0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(vocab + 31, d, generator=g) / d**0.5
    return (torch.randn(b, d, generator=g) * spread), shared[:vocab]


def _packed(w: torch.Tensor) -> RowPacker:
    if not packing_supported(w):
        pytest.skip("oneDNN packs fp32 CPU rows only")
    return RowPacker(block_rows=BLOCK)


def _per_head(path: str, h, w, batch, bias, packer):  # type: ignore[no-untyped-def]
    """One head group through today's per-group op on its own rows w [V, d]."""
    if path == "split":
        return split.unembed_and_sample(h, w, batch, bias)
    if path == "split-packed":
        return split.unembed_and_sample(h, w, batch, bias, packer.pack(w))
    if path == "chunked":
        return chunked.unembed_and_sample(h, w, batch, bias, chunk=BLOCK)
    if path == "chunked-packed":
        return chunked.unembed_and_sample(h, w, batch, bias, chunk=BLOCK, packed=packer.pack(w))
    from kernels import triton_fused

    return triton_fused.unembed_and_sample(h, w, batch, bias)


def _run_both(kernel: str, path: str, dev: str, h, w, vocab: list[int], batch,
              bias=None) -> tuple[SampleOutput, dict[int, tuple[torch.Tensor, SampleOutput]]]:
    """The nested pass over w[:max V], and each head group alone (rows in batch order)."""
    row_vocab = torch.tensor(vocab)
    vmax = max(vocab)
    packer = _packed(w) if "packed" in path else None
    h, w = h.to(dev), w.to(dev)
    wmax = w[:vmax]
    packed = None if packer is None else packer.pack(wmax)
    b2 = None if bias is None else bias[:, :vmax].to(dev)
    got = nested.unembed_and_sample(kernel, h, wmax, row_vocab, batch, b2, packed,
                                    chunk=BLOCK if kernel == "chunked" else None)
    groups = {}
    for v in sorted(set(vocab)):
        rows = torch.nonzero(row_vocab == v).squeeze(1)
        sub = take_rows(batch, rows)
        groups[v] = (rows, _per_head(path, h[rows], w[:v], sub,
                                     None if bias is None else bias[rows, :v].to(dev), packer))
    return got, groups


def assert_nested_equals_per_group(got, groups, h, w, batch, bias=None) -> None:  # type: ignore[no-untyped-def]
    for v, (rows, want) in groups.items():
        sub = take_rows(batch, rows)
        tok = got.token_ids.cpu()[rows]
        assert bool((tok < v).all()), (v, tok.tolist())  # never a token outside its head
        assert_same_or_near_tie(tok, want.token_ids.cpu(), h[rows], w[:v], sub,
                                None if bias is None else bias[rows, :v])
        if batch.want_logprobs:
            same = tok == want.token_ids.cpu()
            torch.testing.assert_close(got.logprobs.cpu()[rows][same], want.logprobs.cpu()[same],
                                       atol=2e-5, rtol=2e-5)


def _mix_rows(n: int) -> list[RowParams]:
    return [ROW_MIX[i % len(ROW_MIX)] for i in range(n)]


@pytest.mark.parametrize("kernel,path,dev", PATHS)
@pytest.mark.parametrize("mix", list(MIXES))
def test_nested_equals_per_group_sampling_mix(kernel: str, path: str, dev: str, mix: str) -> None:
    vocab = MIXES[mix]
    if kernel == "fused" and mix not in ("two-heads", "three-heads-interleaved"):
        pytest.skip("the interpreter is slow: two mixes cover the kernel's row limit")
    h, w = _data(len(vocab), 7001, 96, seed=len(mix))
    batch = SamplingBatch.from_rows(_mix_rows(len(vocab)), list(range(3, 3 + len(vocab))),
                                    want_logprobs=True)
    got, groups = _run_both(kernel, path, dev, h, w, vocab, batch)
    assert_nested_equals_per_group(got, groups, h, w, batch)


@pytest.mark.parametrize("kernel,path,dev", PATHS)
def test_nested_equals_per_group_greedy_with_bias(kernel: str, path: str, dev: str) -> None:
    vocab = [5003, 2500, 5003, 777, 2500, 777]
    h, w = _data(len(vocab), 5003, 64, seed=7)
    h[2] = 0  # all logits equal: the lowest allowed id
    bias = torch.zeros(len(vocab), 5003)
    bias[:, ::3] = float("-inf")  # banned tokens
    bias[3, :] = float("-inf")
    bias[3, 100:104] = 0.5  # fewer allowed tokens than top_k
    rows = [RowParams(temperature=0.0)] * 3 + [RowParams(temperature=1.0, top_k=7, seed=1),
                                               RowParams(temperature=0.8, top_p=0.9, seed=2),
                                               RowParams(temperature=1.2, seed=3)]
    batch = SamplingBatch.from_rows(rows, [9] * len(vocab), want_logprobs=True)
    got, groups = _run_both(kernel, path, dev, h, w, vocab, batch, bias)
    assert_nested_equals_per_group(got, groups, h, w, batch, bias)
    assert int(got.token_ids[2]) == 1  # id 0 is banned
    assert 100 <= int(got.token_ids[3]) < 104
    assert bool((got.token_ids.cpu() % 3 != 0).all())


@pytest.mark.parametrize("kernel,path,dev", PATHS[:4])
def test_nested_equals_per_group_seeded_samples_are_batch_independent(
        kernel: str, path: str, dev: str) -> None:
    # The same request (seed, position, hidden state) samples the same token whatever heads
    # share its step, including top-k past K_MAX (the per-head reference fallback).
    vocab = [6000, 1200, 6000, 1200, 3000]
    h, w = _data(1, 6000, 48, seed=9, spread=0.5)
    h = h.expand(len(vocab), -1).contiguous()
    rows = [RowParams(temperature=1.0, seed=5), RowParams(temperature=1.0, seed=5),
            RowParams(temperature=0.9, top_k=100, seed=6), RowParams(temperature=0.9, top_k=100,
                                                                     seed=6),
            RowParams(temperature=1.1, top_p=0.95, seed=7)]
    batch = SamplingBatch.from_rows(rows, [4] * len(vocab), want_logprobs=True)
    got, groups = _run_both(kernel, path, dev, h, w, vocab, batch)
    assert_nested_equals_per_group(got, groups, h, w, batch)
    alone = nested.unembed_and_sample(kernel, h[:1], w[:6000], torch.tensor([6000]),
                                      take_rows(batch, torch.tensor([0])))
    assert int(alone.token_ids[0]) == int(got.token_ids[0])


@pytest.mark.parametrize("kernel", ["split", "chunked"])
@pytest.mark.parametrize("top_k", [0, 10])
def test_nested_sampler_chi_square(kernel: str, top_k: int) -> None:
    # Rows on a 300-row head share the pass with rows on a 500-row head of the same matrix;
    # the small head's rows must follow softmax over its own 300 logits.
    n, temp = 3000, 0.8
    h, w = _data(1, 500, 64, seed=3, spread=1.0)
    hs = h.expand(2 * n, -1).contiguous()
    vocab = [300, 500] * n
    rows = [RowParams(temperature=temp, top_k=top_k, seed=i) for i in range(2 * n)]
    batch = SamplingBatch.from_rows(rows, [i % 7 for i in range(2 * n)])
    toks = nested.unembed_and_sample(kernel, hs, w, torch.tensor(vocab), batch,
                                     chunk=128).token_ids[0::2]
    logits = (h[0].double() @ w[:300].double().T) / temp
    if top_k:
        logits[torch.argsort(logits, descending=True)[top_k:]] = float("-inf")
    p = torch.softmax(logits, 0)
    counts = torch.bincount(toks, minlength=300).double()
    assert counts.shape[0] == 300  # no token of the larger head
    expected = p * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert float(counts[p == 0].sum()) == 0
    assert stats.chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("kernel,path,dev", PATHS)
def test_nested_bias_narrower_than_the_matrix(kernel: str, path: str, dev: str) -> None:
    # An adapted small head in a step with the largest: the bias spans the 2048-row head's
    # columns only, is cut for the 1500-row head and adds nothing past 2048 for the 7001-row
    # head. Checked against the torch reference on each head's rows with the bias spelled out.
    vocab = [7001, 2048, 7001, 2048, 1500, 2048]
    h, w = _data(len(vocab), 7001, 64, seed=11)
    narrow = torch.randn(len(vocab), 2048, generator=torch.Generator().manual_seed(5))
    narrow[0] = narrow[2] = 0  # the largest head is not adapted
    narrow[3, 1000:] = float("-inf")
    narrow[4, 1234] = 100.0
    rows = [RowParams(temperature=0.0), RowParams(temperature=1.0, top_k=7, seed=1),
            RowParams(temperature=0.8, top_p=0.9, seed=2), RowParams(temperature=1.2, seed=3),
            RowParams(temperature=0.0), RowParams(temperature=0.9, seed=4)]
    batch = SamplingBatch.from_rows(rows, [5] * len(vocab), want_logprobs=True)
    packer = _packed(w) if "packed" in path else None
    hd, wd = h.to(dev), w.to(dev)
    got = nested.unembed_and_sample(kernel, hd, wd, torch.tensor(vocab), batch, narrow.to(dev),
                                    None if packer is None else packer.pack(wd),
                                    chunk=BLOCK if kernel == "chunked" else None)
    full = torch.nn.functional.pad(narrow, (0, 7001 - 2048))
    groups = {}
    for v in sorted(set(vocab)):
        r = torch.nonzero(torch.tensor(vocab) == v).squeeze(1)
        groups[v] = (r, reference.unembed_and_sample(h[r], w[:v], take_rows(batch, r),
                                                     full[r, :v]))
    assert_nested_equals_per_group(got, groups, h, w, batch, full)
    assert int(got.token_ids[3]) < 1000
    assert int(got.token_ids[4]) == 1234


def test_nested_rejects_rows_past_the_matrix_and_bad_bias() -> None:
    h, w = _data(2, 100, 8, seed=1)
    batch = SamplingBatch.from_rows([RowParams(temperature=0.0)] * 2, [0, 0])
    with pytest.raises(ShapeMismatch):
        nested.unembed_and_sample("split", h, w, torch.tensor([100, 101]), batch)
    with pytest.raises(ShapeMismatch):
        nested.unembed_and_sample("split", h, w, torch.tensor([0, 50]), batch)
    with pytest.raises(ShapeMismatch):  # wider than the matrix
        nested.unembed_and_sample("chunked", h, w, torch.tensor([100, 50]), batch,
                                  torch.zeros(2, 101))
    with pytest.raises(ShapeMismatch):  # one row short
        nested.unembed_and_sample("split", h, w, torch.tensor([100, 50]), batch,
                                  torch.zeros(1, 100))

"""CPU streaming path: the fused kernel's semantics in torch, one vocabulary chunk at a time.

Each chunk's logits [b, c] (and the int64 temporaries of the counter-keyed noise) stay in
cache; only per-chunk partials survive (kernels/streaming.py). bf16 weights are upcast one
chunk at a time, so no fp32 copy of W is ever written to memory.
"""

from __future__ import annotations

import logging

import torch

from kernels import reference, rng
from kernels.errors import ShapeMismatch
from kernels.packed_rows import BlockReader, PackedRows
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.streaming import Partials, StreamSpec, finish, pack_keys, stream_spec

log = logging.getLogger(__name__)

# Chunk rows: the noise for b×c cells makes ~a dozen int64 temporaries; ~2^17 cells keep them
# within a core's L2, bounded so that small batches still amortize the per-chunk op overhead.
_CELLS = 1 << 17
_CHUNK_RANGE = (1024, 16384)


def default_chunk(b: int) -> int:
    c = 1 << max(0, (_CELLS // max(b, 1)).bit_length() - 1)
    return min(max(c, _CHUNK_RANGE[0]), _CHUNK_RANGE[1])


def unembed_and_sample(
    hidden: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch,
    bias: torch.Tensor | None = None, chunk: int | None = None,
    packed: PackedRows | None = None,
) -> SampleOutput:
    """Same call and result as kernels.reference.unembed_and_sample. `packed`: the same rows
    in oneDNN blocks (kernels.packed_rows), which the chunk logits then come from."""
    _check(hidden, weight, batch)
    vocab = weight.shape[0]
    spec = stream_spec(batch, vocab)
    h32 = hidden.to(torch.float32)  # [b, d]
    bias2 = None if bias is None else bias.to(torch.float32).expand(hidden.shape[0], vocab)
    p = chunk_partials(h32, weight, batch, spec, bias2, chunk or default_chunk(hidden.shape[0]),
                       packed)

    def logit_at(tokens: torch.Tensor) -> torch.Tensor:
        out = (h32 * weight[tokens].to(torch.float32)).sum(dim=1)
        return out if bias2 is None else out + bias2.gather(1, tokens[:, None]).squeeze(1)

    def fallback(rows: torch.Tensor) -> SampleOutput:
        sub = _rows(batch, rows)
        return reference.unembed_and_sample(
            hidden[rows], weight, sub, None if bias2 is None else bias2[rows])

    return finish(p, spec, batch, vocab, logit_at, fallback)


def chunk_partials(
    h32: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch, spec: StreamSpec,
    bias: torch.Tensor | None, chunk: int, packed: PackedRows | None = None,
) -> Partials:
    b, vocab = h32.shape[0], weight.shape[0]
    if packed is not None and packed.vocab != vocab:
        raise ShapeMismatch(f"packed rows have V={packed.vocab}, weight has V={vocab}")
    block = BlockReader(packed, h32) if packed is not None else None
    n = -(-vocab // chunk)
    t = batch.temperature.to(torch.float32)
    sampled = t > 0
    srows = torch.nonzero(sampled).squeeze(1)
    t_safe = torch.where(sampled, t, torch.ones_like(t))[:, None]  # [b, 1]
    seed, pos = batch.seed[srows], batch.position[srows]
    frows = torch.nonzero(spec.filtered).squeeze(1)
    def f32() -> torch.Tensor:
        return torch.empty(b, n, dtype=torch.float32)

    p = Partials(f32(), torch.empty(b, n, dtype=torch.int64))
    if spec.logprobs:
        p.raw_m, p.raw_s = f32(), f32()
    if spec.top_p:
        p.scaled_m, p.scaled_s = f32(), f32()
    if spec.top_k:
        p.cand_keys = torch.full((b, n * spec.top_k), torch.iinfo(torch.int64).min)
    for c, lo in enumerate(range(0, vocab, chunk)):
        hi = min(lo + chunk, vocab)
        raw = (h32 @ weight[lo:hi].to(torch.float32).T if block is None  # [b, c]
               else block(lo, hi))
        if bias is not None:
            raw += bias[:, lo:hi]
        # All-greedy groups (spec.sample False) have nothing to scale: raw is the score.
        scaled = torch.where(sampled[:, None], raw / t_safe, raw) if spec.sample else raw
        score = scaled if spec.sample else raw
        if spec.sample:
            score = scaled.clone()
            score[srows] += rng.gumbel(seed, pos, torch.arange(lo, hi))
        idx = score.argmax(dim=1, keepdim=True)  # first max: lowest id
        p.best_val[:, c] = score.gather(1, idx).squeeze(1)
        p.best_idx[:, c] = idx.squeeze(1) + lo
        if p.raw_m is not None and p.raw_s is not None:
            _lse_partial(raw, p.raw_m, p.raw_s, c)
        if p.scaled_m is not None and p.scaled_s is not None:
            _lse_partial(scaled, p.scaled_m, p.scaled_s, c)
        if p.cand_keys is not None and frows.numel():
            k = min(spec.top_k, hi - lo)
            keys = pack_keys(scaled[frows], torch.arange(lo, hi)[None, :])
            p.cand_keys[frows, c * spec.top_k:c * spec.top_k + k] = torch.topk(keys, k).values
    return p


def _lse_partial(x: torch.Tensor, m: torch.Tensor, s: torch.Tensor, c: int) -> None:
    top = x.max(dim=1).values  # [b]
    safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    m[:, c] = top
    s[:, c] = torch.exp(x - safe[:, None]).sum(dim=1)


def _rows(batch: SamplingBatch, rows: torch.Tensor) -> SamplingBatch:
    return SamplingBatch(
        batch.temperature[rows], batch.top_p[rows], batch.top_k[rows], batch.seed[rows],
        batch.position[rows], batch.want_logprobs,
    )


def _check(hidden: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ShapeMismatch(
            f"hidden must be [b, d] and weight [V, d], got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}")
    if len(batch) != hidden.shape[0]:
        raise ShapeMismatch(f"batch has {len(batch)} rows, hidden has {hidden.shape[0]}")

"""Shared half of the streaming paths (fused Triton, chunked torch): what a pass over the
vocabulary tiles must produce, and the small stage-2 reduction that turns it into tokens.

A streaming pass never holds b×V logits. Per row and per tile it keeps:
- (max score, its id), where score = ℓ/T + Gumbel(seed, position, id) for sampled rows and
  ℓ for greedy rows, so stage 2 is an argmax over tiles (ties -> the lowest id);
- online log-sum-exp partials (m, s) of the raw logits (logprobs) and of ℓ/T (top-p);
- for rows with top-k / top-p, the tile's top K candidates of ℓ/T packed with their ids into
  one int64 key, so that a merge over tiles is exact (ties -> the lowest id, as in the
  reference's stable sort).

Top-k is exact for k <= K_MAX. Top-p without top-k is exact when the K candidates carry at
least p of the mass (the nucleus closes inside them); other rows fall back to the split path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import rng
from kernels.sampling_params import SampleOutput, SamplingBatch

log = logging.getLogger(__name__)

K_MAX = 64  # largest per-tile top-k with an exact streaming form
# fp32 partial sums make the streamed softmax mass accurate to ~1e-6; below this slack the
# nucleus boundary is not certain to lie inside the candidates, so the row falls back.
MASS_SLACK = 1e-5
_LOW32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class StreamSpec:
    sample: bool  # some row has T > 0
    logprobs: bool
    top_p: bool  # some filtered row has p < 1 and no top-k: needs the scaled LSE
    top_k: int  # candidates per tile (a power of two <= K_MAX); 0 when no row is filtered
    filtered: torch.Tensor  # [b] bool: rows sampled among top-k / top-p candidates
    fallback: torch.Tensor  # [b] bool: rows with no exact streaming form (k > K_MAX)


def stream_spec(batch: SamplingBatch, vocab: int | torch.Tensor) -> StreamSpec:
    """`vocab`: the head's V, or per row [b] int64 (a nested pass over several heads)."""
    t, k, p = batch.temperature, batch.top_k, batch.top_p
    sampled = t > 0
    k_on = (k > 0) & (k < vocab)
    filtered = sampled & (k_on | (p < 1.0))
    fallback = filtered & k_on & (k > K_MAX)
    filtered = filtered & ~fallback
    top_p = bool((filtered & ~k_on).any())
    need = int(k[filtered & k_on].max()) if bool((filtered & k_on).any()) else 0
    if top_p:
        need = K_MAX
    top_k = 0 if need == 0 else max(16, 1 << (need - 1).bit_length())
    return StreamSpec(bool(sampled.any()), batch.want_logprobs, top_p, min(top_k, K_MAX),
                      filtered, fallback)


def pack_keys(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """fp32 values and int ids -> int64 keys ordered by (value, -id): a descending top-k on the
    keys ranks by value with ties to the lowest id."""
    bits = values.contiguous().view(torch.int32).to(torch.int64)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-int order == float order
    return (ordered << 32) | (_LOW32 - ids.to(torch.int64))


def unpack_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ordered = keys >> 32
    bits = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(torch.int32)
    return bits.view(torch.float32), _LOW32 - (keys & _LOW32)


def combine_lse(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per-tile partials m = max, s = Σ exp(x - m), both [b, n] -> log Σ exp over all tiles [b]."""
    top = m.max(dim=1).values  # [b]
    safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = (s * torch.exp(m - safe[:, None])).sum(dim=1)
    return torch.where(torch.isfinite(top), safe + torch.log(total), top)


@dataclass(slots=True)
class Partials:
    best_val: torch.Tensor  # [b, n] fp32: per-tile max score
    best_idx: torch.Tensor  # [b, n] int64: its vocabulary id
    raw_m: torch.Tensor | None = None  # [b, n] LSE partials of the raw logits
    raw_s: torch.Tensor | None = None
    scaled_m: torch.Tensor | None = None  # [b, n] LSE partials of ℓ/T
    scaled_s: torch.Tensor | None = None
    cand_keys: torch.Tensor | None = None  # [b, n·K] int64 packed (ℓ/T, id)


Fallback = Callable[[torch.Tensor], SampleOutput]  # row indices [r] -> their split-path output


def finish(
    p: Partials, spec: StreamSpec, batch: SamplingBatch, vocab: int | torch.Tensor,
    logit_at: Callable[[torch.Tensor], torch.Tensor], fallback: Fallback,
) -> SampleOutput:
    """Stage 2. logit_at(token_ids [b]) -> their raw logits [b] fp32 (for logprobs).
    `vocab`: V, or per row [b] (each row's own head, as in stream_spec)."""
    dev = p.best_val.device
    tile = p.best_val.argmax(dim=1, keepdim=True)  # first max: the lowest tile
    tokens = p.best_idx.gather(1, tile).squeeze(1)  # [b]
    to_split = spec.fallback.to(dev).clone()
    filtered = spec.filtered.to(dev)
    if bool(filtered.any()):
        rows = torch.nonzero(filtered).squeeze(1)
        toks, inexact = _sample_candidates(p, spec, batch, vocab, rows)
        tokens[rows] = toks
        to_split[rows[inexact]] = True
    logprobs = None
    if spec.logprobs:
        assert p.raw_m is not None and p.raw_s is not None
        logprobs = logit_at(tokens) - combine_lse(p.raw_m, p.raw_s)
    if bool(to_split.any()):
        rows = torch.nonzero(to_split).squeeze(1)
        out = fallback(rows)
        tokens[rows] = out.token_ids.to(dev)
        if logprobs is not None and out.logprobs is not None:
            logprobs[rows] = out.logprobs.to(dev)
    return SampleOutput(token_ids=tokens, logprobs=logprobs)


def _sample_candidates(
    p: Partials, spec: StreamSpec, batch: SamplingBatch, vocab: int | torch.Tensor,
    rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k / top-p + Gumbel-max over the merged candidates of `rows` -> (tokens [r],
    inexact [r] bool: the nucleus did not close inside the candidates)."""
    assert p.cand_keys is not None
    dev = rows.device
    keys = p.cand_keys[rows]  # [r, n·K]
    top = torch.topk(keys, min(spec.top_k, keys.shape[1]), dim=1).values  # sorted, descending
    vals, ids = unpack_keys(top)  # [r, K]
    k = batch.top_k.to(dev)[rows]
    top_p = batch.top_p.to(dev, torch.float64)[rows]
    v = vocab.to(dev)[rows] if isinstance(vocab, torch.Tensor) else vocab
    k_on = (k > 0) & (k < v)
    rank = torch.arange(vals.shape[1], device=dev)[None, :]
    keep = ~k_on[:, None] | (rank < k[:, None])
    # float64 softmax as in the reference's filter_mask. Normalizer: the top-k set when top-k
    # is on (all of it is among the candidates), else the whole vocabulary's streamed LSE.
    vals64 = vals.to(torch.float64).masked_fill(~keep, float("-inf"))
    z = torch.logsumexp(vals64, dim=1)
    if spec.top_p:
        assert p.scaled_m is not None and p.scaled_s is not None
        lse_all = combine_lse(p.scaled_m[rows], p.scaled_s[rows]).to(torch.float64)
        z = torch.where(k_on, z, lse_all)
    probs = torch.exp(vals64 - z[:, None])
    keep &= (torch.cumsum(probs, dim=1) - probs) < top_p[:, None]
    inexact = ~k_on & (top_p < 1.0) & (probs.sum(dim=1) < top_p + MASS_SLACK)
    noise = rng.gumbel_at(batch.seed.to(dev)[rows], batch.position.to(dev)[rows], ids)
    score = (vals + noise).masked_fill(~keep, float("-inf"))
    return ids.gather(1, score.argmax(dim=1, keepdim=True)).squeeze(1), inexact


def near_tie_tolerance(
    hidden: torch.Tensor, weight: torch.Tensor, temperature: torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per row [b]: the score gap below which two correct paths may pick different tokens.

    Any fp32-accumulated dot product ℓ = Σ_k h_k w_k, in any summation order, is within
    γ_d·Σ|h_k w_k| ≤ γ_d·‖h‖·max_j‖w_j‖ of the exact value, γ_d = d·u/(1 - d·u), u = 2^-24
    (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). Two paths, two tokens:
    their score difference can move by 4·γ_d·‖h‖·max‖w‖ / T (T = 1 for greedy rows). Tokens
    whose exact scores lie closer than this are a near-tie; any other disagreement is a bug.

    `out_dtype` bf16: a path whose product rounds each logit to bf16 once (oneDNN's packed bf16
    rows) moves it by up to 2^-8·|ℓ| ≤ 2^-8·‖h‖·max‖w‖ more (bf16 keeps 8 significant bits),
    so a pair by twice that.
    """
    d = hidden.shape[1]
    u = d * 2.0**-24
    gamma = u / (1 - u)
    rounding = 2 * 2.0**-8 if out_dtype == torch.bfloat16 else 0.0
    h = hidden.to(torch.float64).norm(dim=1)  # [b]
    w = weight.to(torch.float64).norm(dim=1).max()
    t = temperature.to(torch.float64)
    return (4 * gamma + rounding) * h * w / torch.where(t > 0, t, torch.ones_like(t))

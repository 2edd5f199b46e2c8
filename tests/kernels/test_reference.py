"""Reference unembedding + sampler against a straightforward per-row oracle, plus statistics."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from kernels import rng
from kernels.errors import ShapeMismatch
from kernels.reference import compute_logits, filter_mask, unembed_and_sample
from kernels.row_params import RowParams
from kernels.sampling_params import SamplingBatch

M64 = (1 << 64) - 1
# Max |logit error| against a float64 matmul of the original fp32 data, hidden scaled by 1/sqrt(d).
LOGIT_ATOL = {torch.float32: 1e-5, torch.bfloat16: 6e-2}

ROW_MIX = [
    RowParams(temperature=0.0),
    RowParams(temperature=0.7, seed=11),
    RowParams(temperature=1.0, top_k=5, seed=12),
    RowParams(temperature=1.3, top_p=0.9, seed=13),
    RowParams(temperature=0.5, top_k=50, top_p=0.8, seed=14),
    RowParams(temperature=1.0, top_k=1, seed=15),
    RowParams(temperature=2.0, top_p=0.3, seed=16),
]


# ---------------------------------------------------------------- oracle (one row at a time)


def _oracle_keep(scaled: list[float], top_k: int, top_p: float) -> set[int]:
    v = len(scaled)
    order = sorted(range(v), key=lambda j: (-scaled[j], j))  # ties by lowest id
    if 0 < top_k < v:
        order = order[:top_k]
    m = max(scaled[j] for j in order)
    weights = [math.exp(scaled[j] - m) if scaled[j] > -math.inf else 0.0 for j in order]
    total = sum(weights)
    kept, mass = [], 0.0
    for j, w in zip(order, weights, strict=True):
        if mass >= top_p:
            break
        kept.append(j)
        mass += w / total
    return set(kept)


def _oracle_sample(logits: torch.Tensor, rows: list[RowParams], positions: list[int]) -> list[int]:
    out = []
    for i, (r, pos) in enumerate(zip(rows, positions, strict=True)):
        row = logits[i]
        if r.temperature == 0.0:
            out.append(int(row.argmax()))
            continue
        scaled = row / torch.tensor(r.temperature, dtype=torch.float32)
        keep = _oracle_keep(scaled.tolist(), r.top_k, r.top_p)
        noise = rng.gumbel(torch.tensor([r.seed]), torch.tensor([pos]), row.numel())[0]
        score = scaled + noise
        out.append(max(keep, key=lambda j: (float(score[j]), -j)))
    return out


def _splitmix_scalar(seed: int, pos: int, tok: int) -> int:
    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    row = mix(mix((seed + 0x9E3779B97F4A7C15) & M64) ^ ((pos * 0x94D049BB133111EB) & M64))
    return mix((row + (tok + 1) * 0x9E3779B97F4A7C15) & M64)


def _batch(rows: list[RowParams], positions: list[int], logprobs: bool = False) -> SamplingBatch:
    return SamplingBatch.from_rows(rows, positions, want_logprobs=logprobs)


def _fixed_logits(logits: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    # hidden [n, 1] of ones against weight [V, 1] = logits reproduces the logits exactly.
    return torch.ones(n, 1), logits.to(torch.float32)[:, None]


def _draws(logits: torch.Tensor, row: RowParams, n: int) -> torch.Tensor:
    hidden, weight = _fixed_logits(logits, n)
    rows = [RowParams(row.temperature, row.top_p, row.top_k, seed=s) for s in range(n)]
    positions = [(s * 7919) % 4096 for s in range(n)]
    return unembed_and_sample(hidden, weight, _batch(rows, positions)).token_ids


# ---------------------------------------------------------------- rng


def test_hash_matches_scalar_splitmix64() -> None:
    seeds, positions = [0, 1, 2**40 + 3, -5], [0, 17, 123456, 9]
    bits = rng.hash_bits(torch.tensor(seeds), torch.tensor(positions), 6)
    for i, (s, p) in enumerate(zip(seeds, positions, strict=True)):
        for t in range(6):
            assert int(bits[i, t]) & M64 == _splitmix_scalar(s & M64, p, t)


def test_noise_is_independent_of_tiling() -> None:
    seed, pos = torch.tensor([3, 4]), torch.tensor([10, 10])
    full = rng.gumbel(seed, pos, 5000)
    tile = rng.gumbel(seed, pos, torch.arange(1234, 2345))
    assert torch.equal(full[:, 1234:2345], tile)
    assert torch.equal(
        rng.uniform_noise(seed, pos, 5000)[:, 7:9],
        rng.uniform_noise(seed, pos, torch.tensor([7, 8])),
    )


def test_uniform_and_gumbel_moments() -> None:
    u = rng.uniform_noise(torch.arange(64), torch.zeros(64, dtype=torch.int64), 4096)
    assert u.dtype == torch.float32 and bool((u > 0).all() and (u < 1).all())
    assert stats.kstest(u.flatten()[:50_000].double().numpy(), "uniform").pvalue > 1e-3
    g = rng.gumbel(torch.arange(64), torch.ones(64, dtype=torch.int64), 4096)
    assert bool(torch.isfinite(g).all())
    assert abs(float(g.double().mean()) - 0.5772156649) < 0.01  # Euler–Mascheroni
    assert abs(float(g.double().var()) - math.pi**2 / 6) < 0.03


# ---------------------------------------------------------------- against the oracle


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [17, 64])
@pytest.mark.parametrize("v", [1, 5003, 8191])
@pytest.mark.parametrize("b", [1, 3, 7])
def test_matches_oracle(b: int, v: int, d: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(b * 100_003 + v * 7 + d)
    hidden32 = torch.randn(b, d, generator=gen) / math.sqrt(d)
    weight32 = torch.randn(v, d, generator=gen)
    hidden, weight = hidden32.to(dtype), weight32.to(dtype)
    rows = [ROW_MIX[(i + v) % len(ROW_MIX)] for i in range(b)]
    positions = [int(x) for x in torch.randint(0, 10_000, (b,), generator=gen)]

    logits = compute_logits(hidden, weight)
    assert logits.dtype == torch.float32 and logits.shape == (b, v)
    exact = hidden32.double() @ weight32.double().T
    assert float((logits.double() - exact).abs().max()) < LOGIT_ATOL[dtype]

    out = unembed_and_sample(hidden, weight, _batch(rows, positions, logprobs=True))
    assert out.token_ids.dtype == torch.int64 and out.token_ids.shape == (b,)
    assert out.token_ids.tolist() == _oracle_sample(logits, rows, positions)
    assert out.logprobs is not None and out.logprobs.dtype == torch.float32
    want = torch.log_softmax(exact, dim=-1).gather(1, out.token_ids[:, None]).squeeze(1)
    assert torch.allclose(out.logprobs.double(), want, atol=2 * LOGIT_ATOL[dtype])


def test_logprobs_absent_unless_asked() -> None:
    out = unembed_and_sample(torch.randn(2, 8), torch.randn(30, 8), _batch(ROW_MIX[:2], [0, 0]))
    assert out.logprobs is None


def test_greedy_is_argmax_with_ties_to_lowest_id() -> None:
    weight = torch.randn(100, 16)
    weight[40] = weight[70] = weight[90] = 10 * torch.ones(16)  # a three-way tie at the top
    hidden = torch.ones(4, 16)
    out = unembed_and_sample(hidden, weight, _batch([RowParams(0.0)] * 4, [0, 1, 2, 3]))
    assert out.token_ids.tolist() == [40] * 4


def test_filter_mask_matches_oracle_sets() -> None:
    gen = torch.Generator().manual_seed(0)
    scaled = torch.randn(6, 300, generator=gen) * 2
    top_k = torch.tensor([0, 10, 0, 40, 1, 300])
    top_p = torch.tensor([0.5, 1.0, 0.95, 0.7, 0.3, 0.01])
    mask = filter_mask(scaled, top_k, top_p)
    for i in range(6):
        want = _oracle_keep(scaled[i].tolist(), int(top_k[i]), float(top_p[i]))
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == want


def test_top_k_membership() -> None:
    logits = torch.linspace(0.0, 1.0, 200)  # flat enough that every kept token shows up
    drawn = set(_draws(logits, RowParams(1.0, top_k=7), 3000).tolist())
    assert drawn == set(range(193, 200))


def test_top_p_set() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))
    # mass before each rank: 0, .4, .7, .85, .95 -> p=0.7 keeps {0, 1}; p=0.71 keeps {0, 1, 2}
    assert set(_draws(logits, RowParams(1.0, top_p=0.7), 2000).tolist()) == {0, 1}
    assert set(_draws(logits, RowParams(1.0, top_p=0.71), 2000).tolist()) == {0, 1, 2}
    assert set(_draws(logits, RowParams(1.0, top_p=0.05), 500).tolist()) == {0}  # top-1 kept


# ---------------------------------------------------------------- goodness of fit


def _chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    support = probs > 0
    assert float(counts[~support].sum()) == 0.0, "sampled a filtered-out token"
    expected = probs.double() / probs.double().sum() * tokens.numel()
    # Chi-square needs >= 5 expected per cell: pool the rarest tokens into one cell.
    ids = torch.nonzero(support).flatten()
    ids = ids[torch.argsort(expected[ids])]
    n_pool = int((torch.cumsum(expected[ids], 0) < 5).sum()) + 1 if expected[ids[0]] < 5 else 0
    pool, rest = ids[:n_pool], ids[n_pool:]
    obs = torch.cat([counts[rest], counts[pool].sum()[None]])
    exp = torch.cat([expected[rest], expected[pool].sum()[None]])
    if n_pool == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert float(exp.min()) >= 5, "too few draws for a chi-square test"
    exp = exp * obs.sum() / exp.sum()  # scipy demands equal totals to ~1e-8
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


def test_chi2_plain_sampling() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(logits.double() / 0.8, dim=-1)
    assert _chi2_pvalue(_draws(logits, RowParams(0.8), 20_000), probs) > 1e-3


def test_chi2_filtered_sampling() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(2))
    row = RowParams(1.2, top_k=30, top_p=0.8)
    keep = _oracle_keep((logits / 1.2).tolist(), 30, 0.8)
    mask = torch.zeros(50, dtype=torch.bool)
    mask[list(keep)] = True
    probs = torch.softmax((logits.double() / 1.2).masked_fill(~mask, -math.inf), dim=-1)
    assert 1 < len(keep) < 30
    assert _chi2_pvalue(_draws(logits, row, 20_000), probs) > 1e-3


def test_all_equal_logits_is_uniform_and_greedy_picks_zero() -> None:
    logits = torch.full((50,), 3.0)
    assert _chi2_pvalue(_draws(logits, RowParams(1.0), 10_000), torch.full((50,), 0.02)) > 1e-3
    hidden, weight = _fixed_logits(logits, 2)
    out = unembed_and_sample(hidden, weight, _batch([RowParams(0.0)] * 2, [0, 1], logprobs=True))
    assert out.token_ids.tolist() == [0, 0]
    assert out.logprobs is not None
    assert torch.allclose(out.logprobs, torch.full((2,), -math.log(50)))


def test_minus_inf_logits_are_never_chosen() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(3))
    banned = torch.arange(0, 50, 3)
    logits[banned] = -math.inf
    logits[0] = -math.inf
    hidden, weight = _fixed_logits(logits, 1)
    assert bool(torch.isneginf(compute_logits(hidden, weight)[0, banned]).all())
    probs = torch.softmax(logits.double(), dim=-1)
    tokens = _draws(logits, RowParams(1.0), 8000)
    assert _chi2_pvalue(tokens, probs) > 1e-3
    greedy = unembed_and_sample(hidden, weight, _batch([RowParams(0.0)], [0], logprobs=True))
    assert int(greedy.token_ids[0]) == int(logits.argmax())
    assert greedy.logprobs is not None and bool(torch.isfinite(greedy.logprobs).all())


def test_tiny_temperature_equals_greedy() -> None:
    gen = torch.Generator().manual_seed(4)
    hidden, weight = torch.randn(7, 64, generator=gen), torch.randn(5003, 64, generator=gen)
    rows = [RowParams(1e-6, seed=s) for s in range(7)]
    out = unembed_and_sample(hidden, weight, _batch(rows, list(range(7))))
    assert torch.equal(out.token_ids, compute_logits(hidden, weight).argmax(dim=-1))


def test_disabled_filters_equal_plain_gumbel_max() -> None:
    gen = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(5, 17, generator=gen), torch.randn(1000, 17, generator=gen)
    seeds, positions = list(range(100, 105)), [3, 1, 4, 1, 5]
    off = [RowParams(0.9, top_p=1.0, top_k=0, seed=s) for s in seeds]
    noop = [RowParams(0.9, top_p=1.0, top_k=1000, seed=s) for s in seeds]  # k = V keeps all
    a = unembed_and_sample(hidden, weight, _batch(off, positions)).token_ids
    b = unembed_and_sample(hidden, weight, _batch(noop, positions)).token_ids
    noise = rng.gumbel(torch.tensor(seeds), torch.tensor(positions), 1000)
    plain = (compute_logits(hidden, weight) / 0.9 + noise).argmax(dim=-1)
    assert torch.equal(a, plain) and torch.equal(b, plain)


# ---------------------------------------------------------------- determinism and mixing


def test_same_seed_and_position_is_deterministic() -> None:
    hidden, weight = torch.randn(8, 32), torch.randn(3000, 32)
    batch = _batch([RowParams(1.0, top_p=0.95, seed=s) for s in range(8)], list(range(8)))
    first = unembed_and_sample(hidden, weight, batch).token_ids
    assert torch.equal(first, unembed_and_sample(hidden, weight, batch).token_ids)
    # A row's token does not depend on its neighbours in the group.
    alone = unembed_and_sample(hidden[3:4], weight, _batch([RowParams(1.0, 0.95, seed=3)], [3]))
    assert int(alone.token_ids[0]) == int(first[3])


def test_different_seeds_and_positions_differ() -> None:
    logits = torch.zeros(1000)  # uniform: two independent draws collide with p = 1/1000
    by_seed = _draws(logits, RowParams(1.0), 200)
    assert len(set(by_seed.tolist())) > 150
    hidden, weight = _fixed_logits(logits, 200)
    same_seed = _batch([RowParams(1.0, seed=9)] * 200, list(range(200)))
    assert len(set(unembed_and_sample(hidden, weight, same_seed).token_ids.tolist())) > 150


def test_mixed_greedy_and_sampled_rows() -> None:
    gen = torch.Generator().manual_seed(6)
    hidden, weight = torch.randn(4, 16, generator=gen), torch.randn(500, 16, generator=gen)
    rows = [RowParams(0.0), RowParams(1.5, seed=1), RowParams(0.0), RowParams(1.5, seed=2)]
    out = unembed_and_sample(hidden, weight, _batch(rows, [0, 0, 0, 0]))
    logits = compute_logits(hidden, weight)
    assert out.token_ids.tolist() == _oracle_sample(logits, rows, [0, 0, 0, 0])
    assert int(out.token_ids[0]) == int(logits[0].argmax())


# ---------------------------------------------------------------- validation


def test_shape_mismatches() -> None:
    batch = _batch([RowParams()] * 2, [0, 0])
    with pytest.raises(ShapeMismatch, match="d=8"):
        unembed_and_sample(torch.randn(2, 8), torch.randn(10, 9), batch)
    with pytest.raises(ShapeMismatch, match="batch.temperature"):
        unembed_and_sample(torch.randn(3, 8), torch.randn(10, 8), batch)
    with pytest.raises(ShapeMismatch):
        compute_logits(torch.randn(8), torch.randn(10, 8))

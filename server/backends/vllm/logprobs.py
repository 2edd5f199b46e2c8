"""vLLM's logprob records, read into the Chunk fields the backend maps back to a head.

Both engine forms give, per position, {token id: (logprob, rank)} holding the top N and the
position's own token. The plugin fills every column outside the request's head with -inf, so
vLLM's log-softmax over the whole id space is exactly the head's own distribution and its
top N lie inside the head's range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Ranked = Mapping[int, tuple[float, int]]  # token id -> (logprob, rank)
Top = tuple[tuple[int, float], ...]


def top_n(entry: Ranked, n: int) -> Top:
    ranked = sorted((rank, tid, lp) for tid, (lp, rank) in entry.items() if rank <= n)
    return tuple((tid, lp) for _, tid, lp in ranked)


def prompt_records(entries: Sequence[Ranked | None], ids: Sequence[int], n: int
                   ) -> tuple[tuple[float, int, Top], ...]:
    """Prompt tokens 1..: each one's (logprob, rank, top n); entries[0] is vLLM's None."""
    out = []
    for entry, tid in zip(entries[1:], ids[1:], strict=True):
        assert entry is not None
        lp, rank = entry[tid]
        out.append((lp, rank, top_n(entry, n)))
    return tuple(out)

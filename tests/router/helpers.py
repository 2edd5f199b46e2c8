"""Shared test profiles: a 1B backbone (d=2048, 64 KiB KV/token) with three nested heads."""

from __future__ import annotations

from router.profiles import HeadProfile, HeadTokens, RequestFeatures

N, D, KV = 1_000_000_000, 2048, 65536


def heads(
    train: float = 1e12, bpt: tuple[float, float, float] = (3.9, 4.4, 4.6), sunk: bool = True
) -> list[HeadProfile]:
    """`sunk=False`: heads still to be trained, whose C_train the lifecycle policy counts."""
    sizes = (("32k", 32768), ("131k", 131072), ("262k", 262144))
    return [
        HeadProfile(name, v, D, N, KV, bytes_per_token=b, training_bytes=train,
                    training_sunk=sunk)
        for (name, v), b in zip(sizes, bpt, strict=True)
    ]


def english(prompt_bytes: int = 1200) -> RequestFeatures:
    """Compresses as the heads' manifest figures say (3.9 / 4.4 / 4.6 B/token)."""
    return RequestFeatures(prompt_bytes, 64, tokens={
        "32k": HeadTokens(round(prompt_bytes / 3.9)), "131k": HeadTokens(round(prompt_bytes / 4.4)),
        "262k": HeadTokens(round(prompt_bytes / 4.6))}, script="latin")

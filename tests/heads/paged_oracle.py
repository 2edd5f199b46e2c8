"""Shared oracle check: a backbone run through the paged KV cache against transformers.

Two sequences with scattered, non-contiguous blocks are prefilled together, then decoded
together for several steps; every step's logits must match the HF model on the full prefix.
"""

from __future__ import annotations

import torch

from heads.model.attention import AttentionMetadata, allocate_kv_cache, slots_for
from heads.model.multi_head import MultiHeadModel

BLOCK = 4  # small blocks so short sequences cross block edges
TOL = 1e-4  # fp32 max abs difference allowed


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0]  # [T, V]


def check_prefill_and_decode(
    model: MultiHeadModel, hf: torch.nn.Module, vocab: int, prompt_lens: tuple[int, int],
    steps: int = 6, head: str = "1k",
) -> None:
    b = model.manifest.backbone
    kv = allocate_kv_cache(b.num_layers, 32, BLOCK, b.num_kv_heads, b.head_dim, torch.float32)
    w = model.unembedding_rows(head)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in prompt_lens]
    tables = [[7, 2, 30, 11, 5, 19], [3, 25, 0, 14, 9]]
    ids = torch.tensor(prompts[0] + prompts[1])
    positions = torch.tensor([p for n in prompt_lens for p in range(n)])
    slots = [s for t, n in zip(tables, prompt_lens, strict=True) for s in slots_for(t, 0, n, BLOCK)]
    meta = AttentionMetadata.prefill(list(prompt_lens), torch.tensor(slots))
    with torch.inference_mode():
        logits = model(model.embed(head, ids), positions, meta, kv) @ w.T  # [T, V]
    n0 = prompt_lens[0]
    torch.testing.assert_close(logits[:n0], hf_logits(hf, prompts[0]), atol=TOL, rtol=0)
    torch.testing.assert_close(logits[n0:], hf_logits(hf, prompts[1]), atol=TOL, rtol=0)

    seqs = [list(p) for p in prompts]
    for _ in range(steps):  # contexts grow past block edges (and any sliding window)
        nxt = [int(torch.randint(0, vocab, (1,), generator=gen)) for _ in seqs]
        for s, t in zip(seqs, nxt, strict=True):
            s.append(t)
        pos = [len(s) - 1 for s in seqs]
        step_slots = [slots_for(t, p, p + 1, BLOCK)[0] for t, p in zip(tables, pos, strict=True)]
        meta = AttentionMetadata.decode(
            torch.tensor(step_slots),
            torch.tensor([t[:5] for t in tables]),
            torch.tensor([len(s) for s in seqs]),
        )
        with torch.inference_mode():
            h = model(model.embed(head, torch.tensor(nxt)), torch.tensor(pos), meta, kv)
        for i, s in enumerate(seqs):
            torch.testing.assert_close(h[i] @ w.T, hf_logits(hf, s)[-1], atol=TOL, rtol=0)


def check_cached_prefix(
    model: MultiHeadModel, hf: torch.nn.Module, vocab: int, cached: tuple[int, int],
    new: tuple[int, int], head: str = "1k",
) -> None:
    """Prefill the first `cached[i]` tokens of two prompts, then prefill the other `new[i]` in
    one batch that reads the cached prefix from the blocks; the logits of the second prefill
    must match transformers on the full prompts. One sequence has no cached prefix."""
    b = model.manifest.backbone
    kv = allocate_kv_cache(b.num_layers, 32, BLOCK, b.num_kv_heads, b.head_dim, torch.float32)
    w = model.unembedding_rows(head)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, vocab, (c + n,), generator=gen).tolist()
               for c, n in zip(cached, new, strict=True)]
    tables = [[7, 2, 30, 11, 5, 19, 4, 8], [3, 25, 0, 14, 9, 21, 22, 1]]
    for p, t, c in zip(prompts, tables, cached, strict=True):
        if c:  # the earlier request that filled the cache
            meta = AttentionMetadata.prefill([c], torch.tensor(slots_for(t, 0, c, BLOCK)))
            with torch.inference_mode():
                model(model.embed(head, torch.tensor(p[:c])), torch.arange(c), meta, kv)
    ids = torch.tensor([x for p, c in zip(prompts, cached, strict=True) for x in p[c:]])
    positions = torch.tensor([q for c, n in zip(cached, new, strict=True)
                              for q in range(c, c + n)])
    slots = [s for t, c, n in zip(tables, cached, new, strict=True)
             for s in slots_for(t, c, c + n, BLOCK)]
    meta = AttentionMetadata.prefill(list(new), torch.tensor(slots), list(cached),
                                     torch.tensor(tables))
    with torch.inference_mode():
        logits = model(model.embed(head, ids), positions, meta, kv) @ w.T  # [sum(new), V]
    n0 = new[0]
    for rows, p, c in ((logits[:n0], prompts[0], cached[0]), (logits[n0:], prompts[1], cached[1])):
        torch.testing.assert_close(rows, hf_logits(hf, p)[c:], atol=TOL, rtol=0)

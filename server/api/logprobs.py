"""The `logprobs` blocks of OpenAI responses (completions and chat), and vLLM's
`prompt_logprobs`, from what the engine reported for one choice."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from heads.engine.types import TokenLogprobs

TokenText = Callable[[list[int]], list[str]]  # ids -> each id's own text


def _top_dict(top: TokenLogprobs, token_text: TokenText) -> dict[str, float]:
    strs = token_text([i for i, _ in top.top])
    out: dict[str, float] = {}
    for s, (_, lp) in zip(strs, top.top, strict=True):
        out.setdefault(s, lp)  # two ids may spell the same text: keep the likelier
    return out


def completion_logprobs(ids: Sequence[int], lps: Sequence[float],
                        tops: Sequence[TokenLogprobs], token_text: TokenText,
                        prompt: tuple[Sequence[int], Sequence[TokenLogprobs]] | None = None
                        ) -> dict:
    """`prompt`: an echoed prompt's ids and its tokens' logprobs (from the second token on),
    listed before the generated ones; its first token has no logprob (None), as in OpenAI."""
    tokens = token_text(list(ids))
    token_lps: list[float | None] = list(lps)
    top_lps: list[dict[str, float] | None] | None = (
        [_top_dict(t, token_text) for t in tops] if tops else None)
    if prompt is not None:
        p_ids, p_lps = prompt
        tokens = token_text(list(p_ids)) + tokens
        token_lps = [None, *(t.logprob for t in p_lps), *token_lps]
        if top_lps is not None or any(t.top for t in p_lps):
            top_lps = [None, *(_top_dict(t, token_text) for t in p_lps),
                       *(top_lps or [{} for _ in lps])]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": top_lps,
            "text_offset": offsets}


def chat_logprobs(ids: Sequence[int], lps: Sequence[float], tops: Sequence[TokenLogprobs],
                  token_text: TokenText) -> dict:
    tokens = token_text(list(ids))
    alts = [[] for _ in tokens] if not tops else [
        [{"token": s, "logprob": lp, "bytes": list(s.encode())}
         for s, (_, lp) in zip(token_text([i for i, _ in t.top]), t.top, strict=True)]
        for t in tops]
    content = [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": a}
               for t, lp, a in zip(tokens, lps, alts, strict=True)]
    return {"content": content}


def prompt_logprobs(ids: Sequence[int], lps: Sequence[TokenLogprobs],
                    token_text: TokenText) -> list[dict | None]:
    """vLLM's shape: per prompt position, {id: {logprob, rank, decoded_token}} for the
    prompt's own token and each top alternative; None for the first position."""
    out: list[dict | None] = [None]
    for tok, lp in zip(ids[1:], lps, strict=True):
        entry = {tok: (lp.logprob, lp.rank)}
        for rank, (i, v) in enumerate(lp.top, start=1):
            entry.setdefault(i, (v, rank))
        texts = token_text(list(entry))
        out.append({str(i): {"logprob": v, "rank": r, "decoded_token": s}
                    for (i, (v, r)), s in zip(entry.items(), texts, strict=True)})
    return out

"""The body of a /v1/completions or /v1/chat/completions response, from a RequestPlan, the
deltas its run streamed and each choice's Outcome: the choices, their `logprobs` blocks (an
echoed prompt's first), vLLM's `prompt_logprobs`, and `usage`; as one JSON object or as SSE
chunks."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from heads.engine.types import TokenLogprobs
from heads.vocab.tokenizer import HeadTokenizer
from server.api.errors import sse_error, to_api_error
from server.gateway.generation import Delta, Outcome
from server.gateway.request_plan import ChoiceJob, RequestPlan

TokenText = Callable[[list[int]], list[str]]  # ids -> each id's own text


def usage(plan: RequestPlan, outcomes: list[Outcome]) -> dict:
    completion = sum(o.completion_tokens for o in outcomes)
    # Prompts count once however many choices they have, so cached tokens do too: per prompt,
    # the most any of its choices got from the prefix cache.
    cached: dict[tuple[int, ...], int] = {}
    for job, o in zip(plan.jobs, outcomes, strict=True):
        key = job.request.prompt_ids
        cached[key] = max(cached.get(key, 0), o.cached_tokens)
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": plan.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": min(plan.prompt_tokens, sum(cached.values()))},
    }


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


def _trim(lps: tuple[TokenLogprobs, ...], n: int) -> list[TokenLogprobs]:
    """The engine computes the most alternatives any field asked for; each field shows its own."""
    return [TokenLogprobs(t.logprob, t.top[:n], t.rank) for t in lps]


class CompletionBody:
    """Builds one plan's response: `add` each delta then `body`, or `stream` the deltas."""

    def __init__(self, plan: RequestPlan, tokenizer: HeadTokenizer) -> None:
        self.plan = plan
        self.decode = tokenizer.decode
        n = len(plan.jobs)
        self.text = [""] * n
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.tops: list[list[TokenLogprobs]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n

    def token_text(self, ids: list[int]) -> list[str]:
        return [self.decode([i]) for i in ids]

    def add(self, d: Delta) -> None:
        self.text[d.index] += d.text
        self.ids[d.index].extend(d.token_ids)
        self.lps[d.index].extend(d.logprobs)
        self.tops[d.index].extend(d.tops)
        if d.finish_reason:
            self.finish[d.index] = d.finish_reason

    def body(self, outcomes: list[Outcome]) -> dict:
        p = self.plan
        choices = []
        for i, (job, outcome) in enumerate(zip(p.jobs, outcomes, strict=True)):
            lp = (self._logprobs(job, outcome, self.ids[i], self.lps[i], self.tops[i], True)
                  if p.want_logprobs else None)
            if p.kind == "completion":
                choice = {"index": i, "text": self.text[i], "logprobs": lp,
                          "finish_reason": self.finish[i]}
            else:
                choice = {"index": i, "logprobs": lp, "finish_reason": self.finish[i],
                          "message": {"role": "assistant", "content": self.text[i]}}
            choices.append(self._with_prompt_logprobs(choice, job, outcome))
        obj = "text_completion" if p.kind == "completion" else "chat.completion"
        return {"id": p.request_id, "object": obj, "created": p.created, "model": p.model,
                "choices": choices, "usage": usage(p, outcomes)}

    async def stream(self, deltas: AsyncIterator[Delta],
                     outcomes: list[Outcome]) -> AsyncGenerator[str, None]:
        plan = self.plan
        started: set[int] = set()
        try:
            async for d in deltas:
                first = d.index not in started
                started.add(d.index)
                job, outcome = plan.jobs[d.index], outcomes[d.index]
                lp = None
                if plan.want_logprobs and (d.token_ids or first):
                    lp = self._logprobs(job, outcome, list(d.token_ids), list(d.logprobs),
                                        list(d.tops), first)
                if plan.kind == "completion":
                    choice = {"index": d.index, "text": d.text, "logprobs": lp,
                              "finish_reason": d.finish_reason}
                else:
                    delta: dict = {"content": d.text}
                    if first:
                        delta["role"] = "assistant"
                    choice = {"index": d.index, "delta": delta, "logprobs": lp,
                              "finish_reason": d.finish_reason}
                yield self._chunk([self._with_prompt_logprobs(choice, job, outcome)
                                   if first else choice])
            if plan.include_usage:
                yield self._chunk([], usage(plan, outcomes))
            yield "data: [DONE]\n\n"
        except Exception as e:  # the status line is already sent: report in-band, then end
            yield sse_error(to_api_error(e))
            yield "data: [DONE]\n\n"

    def _logprobs(self, job: ChoiceJob, outcome: Outcome, ids: list[int], lps: list[float],
                  tops: list[TokenLogprobs], first: bool) -> dict:
        """One choice's (or one delta's) logprobs block; `first`: it opens the choice, so an
        echoed prompt's logprobs go first."""
        if self.plan.kind != "completion":
            return chat_logprobs(ids, lps, tops, self.token_text)
        ext = job.extensions
        prompt = None
        if first and ext.echo_prompt and outcome.prompt_logprobs is not None:
            prompt = (job.request.prompt_ids, _trim(outcome.prompt_logprobs, ext.top_logprobs))
        return completion_logprobs(ids, lps, tops, self.token_text, prompt)

    def _with_prompt_logprobs(self, choice: dict, job: ChoiceJob, outcome: Outcome) -> dict:
        n = job.extensions.prompt_logprobs
        if n is not None and outcome.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(
                job.request.prompt_ids, _trim(outcome.prompt_logprobs, n), self.token_text)
        return choice

    def _chunk(self, choices: list[dict], usage_block: dict | None = None) -> str:
        p = self.plan
        obj = "text_completion" if p.kind == "completion" else "chat.completion.chunk"
        body = {"id": p.request_id, "object": obj, "created": p.created, "model": p.model,
                "choices": choices}
        if p.include_usage:
            body["usage"] = usage_block
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

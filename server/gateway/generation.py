"""One generation: token IDs from the backend become text deltas for the client.

Detokenizes incrementally with the request's head, applies stop strings, and closes the
backend stream as soon as the request is done, which aborts it in the engine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from heads.engine.types import (
    GenerationRequest,
    HeadMove,
    PromptScore,
    TokenEvent,
    TokenLogprobs,
)
from heads.vocab.tokenizer import HeadTokenizer, IncrementalDetokenizer
from server.backends.base import Backend
from server.gateway.sampling_extensions import NO_EXTENSIONS, Extensions
from server.gateway.stop_strings import StopStringMatcher
from server.ops.request_context import add_engine_time


@dataclass(frozen=True, slots=True)
class Delta:
    index: int  # choice index
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None = None  # "stop" | "length" on the last delta
    tops: tuple[TokenLogprobs, ...] = ()  # beside token_ids, when top logprobs were asked


@dataclass(slots=True)
class Outcome:
    """Totals of one choice, filled while it streams."""

    completion_tokens: int = 0
    text_bytes: int = 0
    first_token_at: float | None = None
    finish_reason: str | None = None
    parts: list[str] = field(default_factory=list)
    submitted_at: float | None = None  # handed to the engine
    engine_s: float = 0.0  # time spent waiting on the engine's stream
    itl: list[float] = field(default_factory=list)  # gaps between tokens, s
    prompt_score: PromptScore | None = None  # the prompt's NLL, when the engine scored it
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None  # prompt tokens 1.., when asked
    # A laddered request (heads.engine.quality_control): each rung's loss on the prompt and
    # the moves up the ladder the engine made.
    prompt_losses: dict[str, float] | None = None
    moves: list[HeadMove] = field(default_factory=list)
    # Generated tokens and text bytes by the head that sampled them (a ladder's moves split
    # a request over several); empty until the first token.
    head_tokens: dict[str, int] = field(default_factory=dict)
    head_bytes: dict[str, int] = field(default_factory=dict)


async def _timed(stream: AsyncIterator[TokenEvent], outcome: Outcome) -> AsyncIterator[TokenEvent]:
    """Yield the engine's events, adding the time spent waiting on each to outcome.engine_s."""
    it = aiter(stream)
    last = None
    while True:
        t0 = time.perf_counter()
        try:
            event = await anext(it)
        except StopAsyncIteration:
            outcome.engine_s += time.perf_counter() - t0
            return
        now = time.perf_counter()
        outcome.engine_s += now - t0
        if last is not None:
            outcome.itl.append(now - last)
        last = now
        yield event


async def generate_text(
    backend: Backend,
    tokenizer: HeadTokenizer,
    request: GenerationRequest,
    stops: list[str],
    index: int,
    outcome: Outcome,
    ext: Extensions = NO_EXTENSIONS,
    turn_stops: tuple[str, ...] = (),
) -> AsyncGenerator[Delta, None]:
    """`stops`: the client's, armed at min_tokens; `turn_stops`: the chat layout's next-turn
    markers, which end the reply at any length."""
    detok = IncrementalDetokenizer(tokenizer, ext.skip_special_tokens)
    matcher = StopStringMatcher(stops, ext.include_stop_str, turn_stops)
    # A stop id's own text is dropped, as vLLM does, unless asked to stay.
    drop_stop = not ext.include_stop_str
    echo = ext.echo_text  # goes out with the first delta; not generated, so not counted
    eos = request.stop_token_ids
    outcome.submitted_at = time.perf_counter()
    stream = backend.generate(request)
    timed = _timed(stream, outcome)
    try:
        async for event in timed:
            if outcome.first_token_at is None:
                outcome.first_token_at = time.perf_counter()
            if event.prompt_score is not None:
                outcome.prompt_score = event.prompt_score
            if event.cached_tokens is not None:
                outcome.cached_tokens = event.cached_tokens
            if event.prompt_logprobs is not None:
                outcome.prompt_logprobs = event.prompt_logprobs
            if event.prompt_losses is not None:
                outcome.prompt_losses = dict(event.prompt_losses)
            outcome.moves += event.moves
            if ext.score_only:  # echo, max_tokens 0: the engine's one token is dropped (vLLM)
                outcome.finish_reason = "length"
                yield Delta(index, echo, (), (), "length")
                return
            outcome.completion_tokens += 1
            is_eos = event.token_id in eos and event.finish_reason == "stop"
            # vLLM checks stop strings only once min_tokens tokens exist.
            armed = outcome.completion_tokens > ext.rules.min_tokens
            text = "" if is_eos and drop_stop else matcher.feed(detok.push(event.token_id), armed)
            finish = event.finish_reason
            if matcher.matched is not None:
                finish = "stop"
            elif finish is not None:
                text += matcher.feed(detok.flush()) + matcher.flush()
            ids = () if is_eos else (event.token_id,)
            lps = () if event.logprob is None or is_eos else (event.logprob,)
            tops = () if event.top is None or is_eos else (event.top,)
            outcome.text_bytes += len(text.encode())
            sampled_by = event.head or request.head
            outcome.head_tokens[sampled_by] = outcome.head_tokens.get(sampled_by, 0) + 1
            outcome.head_bytes[sampled_by] = (outcome.head_bytes.get(sampled_by, 0)
                                              + len(text.encode()))
            outcome.parts.append(text)
            if echo:
                text, echo = echo + text, ""
            if finish is not None:
                outcome.finish_reason = finish
                yield Delta(index, text, ids, lps, finish, tops)
                return
            if text or ids:
                yield Delta(index, text, ids, lps, None, tops)
    finally:
        # Closing the engine stream aborts the request there and frees its KV blocks.
        await timed.aclose()  # type: ignore[attr-defined]
        await stream.aclose()  # type: ignore[attr-defined]
        add_engine_time(outcome.engine_s)

"""vLLM's sampling extensions on a request, as the rules a generation follows, with a 400
naming what is malformed.

Every extension is accepted at its neutral value (vLLM's own default), so clients that always
send them (`vllm bench serve` sends `repetition_penalty: 1.0`) work unchanged. The ones that
reshape logits (penalties, min_p, logit_bias, allowed_token_ids, bad_words, min_tokens) make
the engine sample that request from its materialised row of logits.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from heads.engine.types import NO_LOGIT_RULES, LogitRules, StructuredSpec
from heads.vocab.tokenizer import HeadTokenizer
from server.errors import BadRequest
from server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

LOGIT_BIAS_LIMIT = 100.0  # vLLM clamps each bias to ±100, as OpenAI bounds it
MAX_BAD_WORDS = 128  # vLLM's VLLM_MAX_NUM_BAD_WORDS default


@dataclass(frozen=True, slots=True)
class Extensions:
    """The served extensions of one request: how its prompt is cut, how each choice's
    tokens become text, when a choice stops beyond its `stop` strings, and which logprobs
    it reports."""

    ignore_eos: bool = False  # the head's EOS ids neither stop nor are dropped
    stop_token_ids: frozenset[int] = frozenset()  # extra ids that end the choice
    include_stop_str: bool = False  # a matched stop string stays in the text
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None  # keep the last k ids; -1: the context's worth
    add_special_tokens: bool | None = None  # None: the route's default (BOS on completions)
    echo_text: str = ""  # chat echo: the final assistant message, before each choice's text
    echo_prompt: bool = False  # completion echo: each choice's prompt before its text
    score_only: bool = False  # echo with max_tokens 0: the prompt and its logprobs, no text
    top_logprobs: int = 0  # alternatives beside each sampled token's logprob
    prompt_logprobs: int | None = None  # per prompt token: its logprob and the top N
    wants_logprobs: bool = False  # the sampled tokens' logprobs (logprobs / logprobs=true)
    structured: StructuredSpec | None = None  # the grammar every choice must match
    structured_field: str = ""  # where the request gave it, for a 400 that names it
    rules: LogitRules = NO_LOGIT_RULES  # logit shaping, bad words not yet tokenized
    bad_words: tuple[str, ...] = ()  # tokenized on the chosen head by rules_on

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """What the engine computes for the prompt: echoed logprobs need it too."""
        if self.echo_prompt and self.wants_logprobs:
            return max(self.prompt_logprobs or 0, self.top_logprobs)
        return self.prompt_logprobs

    def prompt_ids(self, ids: tuple[int, ...], bos: int | None, max_prompt: int
                   ) -> tuple[int, ...]:
        """A prompt's ids as the engine runs them, from the encoder's (BOS first when the
        head has one)."""
        if self.add_special_tokens is False and bos is not None and ids[:1] == (bos,):
            ids = ids[1:]
        elif self.add_special_tokens and bos is not None and ids[:1] != (bos,):
            ids = (bos, *ids)
        k = self.truncate_prompt_tokens
        if k is not None:
            ids = ids[-(max_prompt if k == -1 else k):]
        return ids

    def stop_ids(self, eos_ids: Iterable[int]) -> frozenset[int]:
        """The ids that end a choice on a head whose EOS ids are `eos_ids`."""
        return self.stop_token_ids if self.ignore_eos else self.stop_token_ids | set(eos_ids)

    def rules_on(self, tok: HeadTokenizer) -> LogitRules:
        """The logit rules on one head: each bad word as that head spells it, with and
        without a leading space (vLLM's rule, so a word is banned mid-text too)."""
        if not self.bad_words:
            return self.rules
        words: list[tuple[int, ...]] = []
        for word in self.bad_words:
            bare = tuple(tok.encode(word.lstrip()))
            if not bare:
                raise BadRequest(f"bad_words: {word!r} tokenizes to nothing", param="bad_words")
            words.append(bare)
            spaced = tuple(tok.encode(" " + word.lstrip()))
            if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
                words.append(spaced)
        return dataclasses.replace(self.rules, bad_words_ids=tuple(dict.fromkeys(words)))

    def named_ids(self) -> dict[str, int]:
        """Per field that names token ids, the largest id it names."""
        out = {"stop_token_ids": max(self.stop_token_ids, default=-1),
               "logit_bias": max((t for t, _ in self.rules.logit_bias), default=-1),
               "allowed_token_ids": max(self.rules.allowed_token_ids or (), default=-1)}
        return {k: v for k, v in out.items() if v >= 0}

    @property
    def needs_logits(self) -> bool:
        """Whether serving this needs every id's logit, which a two-level reading lacks."""
        # bad_words are spelled on the chosen head later (rules_on): not yet in `rules`.
        return (self.structured is not None or self.rules.shapes or bool(self.bad_words)
                or self.top_logprobs > 0 or self.engine_prompt_logprobs is not None)

    @property
    def min_vocab(self) -> int:
        """The smallest head vocabulary that holds every id these rules name."""
        return max(self.named_ids().values(), default=-1) + 1


NO_EXTENSIONS = Extensions()


def extensions(body: SamplingFields) -> Extensions:
    """The rules `body` asks for; BadRequest for a malformed one."""
    stop_ids = frozenset(body.stop_token_ids or ())
    if body.max_tokens is not None and body.min_tokens > body.max_tokens:
        raise BadRequest("min_tokens must not exceed max_tokens", param="min_tokens")
    # A chat template renders BOS itself, and the encoder keeps exactly one.
    add = body.add_special_tokens if isinstance(body, CompletionRequest) else None
    if body.truncate_prompt_tokens == 0:
        raise BadRequest("truncate_prompt_tokens must be >= 1, or -1",
                         param="truncate_prompt_tokens")
    echo = ""
    if isinstance(body, ChatCompletionRequest):
        if body.echo and body.messages[-1].role == "assistant":
            echo = body.messages[-1].text()
        wants, top = body.logprobs, (body.top_logprobs or 0) if body.logprobs else 0
    elif isinstance(body, CompletionRequest):
        wants, top = body.logprobs is not None, body.logprobs or 0
    else:
        wants, top = False, 0
    echo_prompt = isinstance(body, CompletionRequest) and body.echo
    return Extensions(body.ignore_eos, stop_ids, body.include_stop_str_in_output,
                      body.skip_special_tokens, body.truncate_prompt_tokens, add, echo,
                      echo_prompt, echo_prompt and body.max_tokens == 0, top,
                      body.prompt_logprobs, wants, *structured_spec(body), logit_rules(body),
                      tuple(dict.fromkeys(body.bad_words or ())))


def logit_rules(body: SamplingFields) -> LogitRules:
    """The head-independent logit rules of `body` (bad words are per head: rules_on)."""
    bias: list[tuple[int, float]] = []
    for key, value in (body.logit_bias or {}).items():
        try:
            tid = int(key)
        except ValueError:
            raise BadRequest(f"logit_bias keys are token ids; got {key!r}",
                             param="logit_bias") from None
        if tid < 0:
            raise BadRequest(f"logit_bias: token id {tid} is negative", param="logit_bias")
        bias.append((tid, max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(value)))))
    if body.allowed_token_ids is not None and not body.allowed_token_ids:
        raise BadRequest("allowed_token_ids must not be empty", param="allowed_token_ids")
    if body.bad_words and any(not w.strip() for w in body.bad_words):
        raise BadRequest("bad_words entries must not be empty", param="bad_words")
    if len(body.bad_words or ()) > MAX_BAD_WORDS:
        raise BadRequest(f"at most {MAX_BAD_WORDS} bad_words", param="bad_words")
    allowed = (frozenset(body.allowed_token_ids) if body.allowed_token_ids is not None
               else None)
    return LogitRules(body.repetition_penalty, body.presence_penalty, body.frequency_penalty,
                      body.min_p, body.min_tokens, tuple(sorted(bias)), allowed)


def check_ids_on_head(rules: Extensions, head: str, vocab: int) -> None:
    """A pinned head must hold every id the request names."""
    for field, largest in rules.named_ids().items():
        if largest >= vocab:
            raise BadRequest(f"{field}: token id {largest} is outside head {head}'s "
                             f"vocabulary [0, {vocab})", param=field)


def _json_text(value: Any, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise BadRequest(f"{param}: the schema is not JSON: {e}", param=param) from e
    if not isinstance(value, dict):
        raise BadRequest(f"{param}: a JSON schema must be an object", param=param)
    return json.dumps(value)


def _response_format(rf: dict[str, Any]) -> StructuredSpec | None:
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredSpec("json_object")
    if kind == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema")
        return StructuredSpec("json_schema", _json_text(schema, "response_format"))
    raise BadRequest(f"response_format type {kind!r} is not supported; use text, json_object "
                     "or json_schema", param="response_format")


def _vllm_spec(key: str, value: Any, param: str) -> StructuredSpec:
    if key == "json":
        return StructuredSpec("json_schema", _json_text(value, param))
    if key == "json_object":
        return StructuredSpec("json_object")
    if key in ("regex", "grammar") and isinstance(value, str):
        return StructuredSpec(key, value)
    if key == "choice" and isinstance(value, list) and value \
            and all(isinstance(c, str) for c in value):
        return StructuredSpec("choice", json.dumps(value))
    raise BadRequest(f"{param}: {key} must be a "
                     f"{'non-empty list of strings' if key == 'choice' else 'string'}",
                     param=param)


def structured_spec(body: SamplingFields) -> tuple[StructuredSpec | None, str]:
    """The one structured-output constraint `body` names, and the field that names it
    (`response_format.json_schema`, `structured_outputs.regex`, `guided_json`, ...)."""
    found: list[tuple[StructuredSpec, str]] = []
    if body.response_format:
        spec = _response_format(body.response_format)
        if spec is not None:
            found.append((spec, f"response_format.{spec.kind}"))
    for key, value in (body.structured_outputs or {}).items():
        if key not in _VLLM_KEYS:
            raise BadRequest(f"structured_outputs.{key} is not supported; use one of "
                             f"{', '.join(_VLLM_KEYS)}", param="structured_outputs")
        if value is not None and value is not False:
            found.append((_vllm_spec(key, value, "structured_outputs"),
                          f"structured_outputs.{key}"))
    for key, value in (("json", body.guided_json), ("regex", body.guided_regex),
                       ("choice", body.guided_choice), ("grammar", body.guided_grammar)):
        if value is not None:
            found.append((_vllm_spec(key, value, f"guided_{key}"), f"guided_{key}"))
    if len(found) > 1:
        raise BadRequest("give one structured output constraint, not several",
                         param="response_format")
    return found[0] if found else (None, "")


_VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")

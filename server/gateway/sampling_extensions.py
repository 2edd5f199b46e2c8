"""vLLM's sampling extensions on a request: the ones served, as rules a generation follows,
and a 400 naming each one that would change the output but is not served yet.

Every extension is accepted at its neutral value (vLLM's own default), so clients that always
send them (`vllm bench serve` sends `repetition_penalty: 1.0`) work unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from server.errors import BadRequest
from server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

# Fields that reshape the logits; the engine's kernels stream the unembedding without ever
# holding a row of logits, so these are refused unless neutral.
_LOGIT_FIELDS = (
    ("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
    ("min_p", 0.0),
)


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
    top_logprobs: int = 0  # alternatives beside each sampled token's logprob
    prompt_logprobs: int | None = None  # per prompt token: its logprob and the top N
    wants_logprobs: bool = False  # the sampled tokens' logprobs (logprobs / logprobs=true)

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

    @property
    def min_vocab(self) -> int:
        """The smallest head vocabulary that holds every id these rules name."""
        return max(self.stop_token_ids, default=-1) + 1


NO_EXTENSIONS = Extensions()


def extensions(body: SamplingFields) -> Extensions:
    """The rules `body` asks for; BadRequest for an extension that is not served."""
    for name, neutral in _LOGIT_FIELDS:
        if getattr(body, name) != neutral:
            raise BadRequest(f"{name} is not supported (only its neutral value {neutral}): "
                             "the kernels sample without materialising logits", param=name)
    if body.logit_bias:
        raise BadRequest("logit_bias is not supported", param="logit_bias")
    if body.allowed_token_ids is not None:
        raise BadRequest("allowed_token_ids is not supported", param="allowed_token_ids")
    if body.bad_words:
        raise BadRequest("bad_words is not supported", param="bad_words")
    stop_ids = frozenset(body.stop_token_ids or ())
    # min_tokens masks the stop ids until that many tokens exist: a no-op when nothing
    # could stop the choice early, which is all that is served without logit masking.
    if body.min_tokens and (not body.ignore_eos or stop_ids or body.stop):
        raise BadRequest("min_tokens is only served with ignore_eos=true and no stop or "
                         "stop_token_ids", param="min_tokens")
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
                      echo_prompt, top, body.prompt_logprobs, wants)


def check_ids_on_head(rules: Extensions, head: str, vocab: int) -> None:
    """A pinned head must hold every id the request names."""
    if rules.min_vocab > vocab:
        bad = max(rules.stop_token_ids)
        raise BadRequest(f"stop_token_ids: token id {bad} is outside head {head}'s "
                         f"vocabulary [0, {vocab})", param="stop_token_ids")

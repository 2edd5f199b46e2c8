"""OpenAI-compatible request bodies, pydantic at the HTTP edge: api/ validates requests with
them and gateway/ plans from them, so they sit below both."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

# OpenAI-documented fields that do not change what is generated: accepted, ignored, and
# named in the x-polyhead-ignored-fields response header. Anything else unknown is a 400.
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier", "parallel_tool_calls",
                  "reasoning_effort", "modalities", "prompt_cache_key", "safety_identifier",
                  "prediction")

# OpenAI-documented fields that would change the output and are not served: a 400 that
# says so, rather than "unknown field".
UNSUPPORTED_FIELDS = {
    "audio": "audio output is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "web_search_options": "web search is not supported",
}

# Bound the integers that reach the engine's C code (int64 there); beyond any vocabulary.
MAX_TOP_K = 2**31 - 1


def lone_surrogate(value: Any) -> str | None:
    """The dotted path of the first string in `value` that is not valid Unicode (a lone
    UTF-16 surrogate, which JSON's \\ud800 escapes can produce), or None. Iterative: bodies
    nest as deep as the JSON parser allows."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(v, dict):
            for k, item in v.items():
                key = str(k)
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{path}.{ascii(key)}".lstrip(".")
                stack.append((f"{path}.{key}".lstrip("."), item))
        elif isinstance(v, list):
            stack.extend((f"{path}.{i}".lstrip("."), item) for i, item in enumerate(v))
    return None


def unsupported(message: str, **ctx: Any) -> PydanticCustomError:
    """A value that is well-formed but not served: the error handler answers 400."""
    return PydanticCustomError("unsupported_value", message, ctx)


class RequestBody(BaseModel):
    """A JSON request body: unknown fields are rejected (400 naming the field) and every
    string must be valid Unicode (400 naming the field), checked before any field."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate(data)
        if where is not None:
            raise PydanticCustomError(
                "invalid_unicode",
                "{field}: text contains a lone UTF-16 surrogate; send valid Unicode",
                {"field": where})
        return data


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class SamplingFields(RequestBody):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    # 0 only with echo on /v1/completions: the prompt scored, nothing generated (as vLLM).
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = Field(default=0, ge=0, le=MAX_TOP_K)  # vLLM's extension; 0 (or -1) disables it
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # Any int64, as OpenAI and vLLM take it; each choice runs on (seed + index) mod 2**63.
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    prompt_bpb: bool | None = None  # polyhead extension: false skips live prompt BPB
    # vLLM's sampling extensions (its SamplingParams names and defaults). Token ids in them
    # mean one thing on every head that holds them: heads are nested.
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    bad_words: list[str] | None = None
    # Keep the last k prompt tokens (-1: as many as the context allows), as vLLM does.
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # vLLM: each prompt token's logprob (and the top N) in the choice's "prompt_logprobs".
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Structured output: OpenAI's response_format, vLLM's structured_outputs
    # ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}) or its guided_* fields.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Accepted and ignored (IGNORED_FIELDS): identifiers, storage and billing hints.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None  # no tools are served, so nothing to parallelize
    reasoning_effort: str | None = None  # the served models do not reason
    modalities: list[str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    prediction: dict[str, Any] | None = None  # predicted output: a latency hint only

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(m != "text" for m in v):
            raise unsupported("only the 'text' modality is served")
        return v

    def ignored_fields(self) -> list[str]:
        """The ignored fields this request set, for the response header and the log."""
        return [f for f in IGNORED_FIELDS if f in self.model_fields_set]

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k_off(cls, v: Any) -> Any:
        return 0 if v == -1 else v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    # Text, texts, or token ids (one list, or a list of lists): ids need a pinned head.
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True  # vLLM: BOS before a completion prompt

    def prompts(self) -> list[str]:
        """The text prompts; empty when the prompt is token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        return [p for p in self.prompt if isinstance(p, str)]

    def token_prompts(self) -> list[list[int]] | None:
        """The prompt as token id lists, or None when it is text (an empty list is text)."""
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], str):
            return None
        if isinstance(p[0], int):
            return [list(p)]
        return [list(ids) for ids in p]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id ... pass through to templates
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string or content parts; only {"type": "text", "text": ...} parts are served.
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: str | list[dict[str, Any]] | None) -> Any:
        if isinstance(v, list):
            for part in v:
                kind = part.get("type")
                if kind != "text":
                    raise unsupported("content parts of type {kind} are not supported; "
                                      "only 'text'", kind=repr(kind))
                if not isinstance(part.get("text"), str):
                    raise unsupported("a text content part needs a string 'text'")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p["text"] for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    # vLLM's chat extensions. The template adds BOS itself, so add_special_tokens is off.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    echo: bool = False  # prepend the last message's content when it is the assistant's

    @model_validator(mode="after")
    def _open_turn(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise unsupported("continue_final_message needs add_generation_prompt=false")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise unsupported("continue_final_message needs a final assistant message")
        return self

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ResponsesRequest(RequestBody):
    """POST /v1/responses, text in and text out; run as the chat completion it describes."""

    model: str
    input: str | list[dict[str, Any]]  # a user message, or message items
    instructions: str | None = None  # a system message before the input
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    stream: bool = False
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text"}} only
    truncation: Literal["disabled", "auto"] | None = None
    # Accepted and ignored, as on chat (IGNORED_FIELDS).
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None  # nothing is stored: previous_response_id is refused
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class TokenizeRequest(RequestBody):
    """vLLM's /tokenize: a completion `prompt` or chat `messages` (exactly one)."""

    model: str | None = None  # None: the model itself, the router picks the head
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # BOS, as /v1/completions runs the prompt
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise unsupported("give exactly one of 'prompt' and 'messages'")
        if not self.add_generation_prompt:
            raise unsupported("chat templates are rendered with add_generation_prompt=true")
        return self


class DetokenizeRequest(RequestBody):
    """vLLM's /detokenize: token ids of one head (the model must pin it)."""

    model: str | None = None
    tokens: list[int]


class PolicyDocument(RequestBody):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    guard: dict[str, Any] | None = None  # quality guard (router.policy.guard); null: none

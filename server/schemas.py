"""OpenAI-compatible request and response bodies (pydantic lives only at this edge)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    # Unknown fields are rejected (422 naming the field) rather than silently ignored.
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = Field(default=0, ge=0)  # vLLM's extension; 0 (or -1) disables it
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    prompt_bpb: bool | None = None  # polyhead extension: false skips live prompt BPB

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k_off(cls, v: Any) -> Any:
        return 0 if v == -1 else v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id ... pass through to templates
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class PolicyDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    guard: dict[str, Any] | None = None  # quality guard (router.guard); null: none


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

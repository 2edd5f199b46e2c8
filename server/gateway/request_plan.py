"""A validated request, ready to run: the chosen head, its token IDs, one job per choice."""

from __future__ import annotations

from dataclasses import dataclass

from heads.engine.types import GenerationRequest
from heads.vocab.prompt_encoder import EncodedPrompt
from router.policy.base import Decision
from server.gateway.sampling_extensions import NO_EXTENSIONS, Extensions


@dataclass(frozen=True, slots=True)
class ChoiceJob:
    index: int
    request: GenerationRequest
    stops: tuple[str, ...]  # the client's
    extensions: Extensions = NO_EXTENSIONS
    # A chat layout's next-turn markers: they end the reply even before min_tokens.
    turn_stops: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestPlan:
    request_id: str
    kind: str  # "completion" | "chat"
    route: str  # "/v1/completions" | "/v1/chat/completions"
    created: int  # unix seconds
    model: str  # echoed back as the response's "model"
    decision: Decision
    prompt_tokens: int  # summed over prompts (each counted once, not per choice)
    prompt_bytes: int
    jobs: tuple[ChoiceJob, ...]
    want_logprobs: bool
    include_usage: bool
    started_at: float  # perf_counter at arrival, for TTFT and e2e
    encoded: EncodedPrompt  # the rendered prompts and their ids on every head tokenized
    chat: bool = False

    def predicted_bpt(self, head: str) -> float | None:
        """The router's predicted output bytes/token on `head` for this request, if any."""
        value = self.decision.request.get("heads", {}).get(head, {})
        return value.get("predicted_bytes_per_token")

    def predicted_penalty(self, head: str) -> float | None:
        """The router's predicted BPB penalty of `head` for this request, if any."""
        return self.decision.request.get("heads", {}).get(head, {}).get("bpb_penalty")

    @property
    def choices_per_prompt(self) -> int:
        return len(self.jobs) // max(1, len(self.encoded.texts))

    @property
    def max_tokens(self) -> int:
        return self.jobs[0].request.max_tokens

    @property
    def head(self) -> str:
        return self.decision.head

    def headers(self) -> dict[str, str]:
        return {
            "x-polyhead-head": self.decision.head,
            "x-polyhead-policy": f"{self.decision.policy}@v{self.decision.version}",
        }

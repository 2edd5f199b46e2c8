"""Plan a request: validate it, render and tokenize its prompt, and ask the router for a head.

The result is a RequestPlan: the chosen head, its token ids and one engine request per
choice. Nothing here reserves anything; the gateway admits a plan afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heads.engine.types import GenerationRequest, QualityLadder, StructuredSpec
from heads.errors import GrammarError
from heads.manifest import Manifest
from heads.vocab.prompt_encoder import EncodedPrompt, HeadPrompt, PromptEncoder
from heads.vocab.tokenizer import HeadTokenizer
from kernels.row_params import RowParams
from router.policy.base import Decision
from router.profiles import HeadTokens, RequestFeatures
from router.router import Router
from server.errors import BadRequest, NotFound
from server.gateway.chat_template import (
    RESERVED_TEMPLATE_VARS,
    ChatFormat,
    choose_chat_format,
    render_chat,
    special_on_every_head,
)
from server.gateway.grammar_errors import bad_structured_output
from server.gateway.prompt_bpb import PromptBpbConfig
from server.gateway.request_plan import ChoiceJob, RequestPlan
from server.gateway.sampling_extensions import (
    NO_EXTENSIONS,
    Extensions,
    check_ids_on_head,
    extensions,
)
from server.ops.metrics import Metrics
from server.ops.request_context import new_id
from server.ops.tracing import NoTracing
from server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from server.settings import Settings

if TYPE_CHECKING:
    from heads.engine.grammar import GrammarCompiler

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask for. A request past any of them is a 400 naming the field,
    as vLLM answers; /v1/models and /tokenize serve max_model_len."""

    default_max_tokens: int
    max_stop_sequences: int
    max_model_len: int  # prompt + output tokens; max_tokens may be at most what the prompt leaves
    max_prompt_tokens: int  # a prompt is prefilled in one step, never chunked
    max_n: int
    max_prompt_bytes: int  # UTF-8 bytes over all prompts, checked before tokenizing

    @staticmethod
    def from_settings(s: Settings, max_model_len: int) -> Limits:
        return Limits(s.default_max_tokens, s.max_stop_sequences, max_model_len,
                      s.max_num_batched_tokens, s.max_n, s.max_prompt_bytes)

    def check_context(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"prompt, {max_tokens} for the completion). Please reduce the prompt or "
                "max_tokens.", param="max_tokens")


# Prompts from this many characters are tokenized off the event loop: about 1 ms of
# tokenizing over three heads, more than a thread hand-off costs.
OFFLOAD_CHARS = 4096


class RequestPlanner:
    """`observe_request(prompt_bytes, max_tokens)` feeds KV admission's typical request;
    `chat_format`: a server.gateway.chat_template format name ("auto" picks one)."""

    def __init__(self, manifest: Manifest, tokenizers: dict[str, HeadTokenizer], router: Router,
                 metrics: Metrics, limits: Limits, tracing: NoTracing,
                 prompt_bpb: PromptBpbConfig,
                 observe_request: Callable[[int, int], None] | None = None,
                 grammars: GrammarCompiler | None = None,
                 chat_format: str = "auto",
                 ladder: Callable[[tuple[str, ...], float], QualityLadder] = QualityLadder
                 ) -> None:
        self.manifest = manifest
        self.ladder = ladder  # (rungs, bound) -> the engine's ladder for a decision
        self.grammars = grammars
        self.tokenizers = tokenizers
        self.router = router
        self.metrics = metrics
        self.limits = limits
        self.tracing = tracing
        self.prompt_bpb = prompt_bpb
        self.observe_request = observe_request
        self._bpb_rng = random.Random()  # picks the scored share of requests ("sampled")
        self.encoder = PromptEncoder(tokenizers, {h.name: h.bos_token_id for h in manifest.heads})
        self.chat_format: ChatFormat = choose_chat_format(
            manifest.chat_template, manifest.backbone.architecture,
            functools.partial(special_on_every_head, tokenizers), chat_format)
        # Per head: the ids that end a chat reply, its EOS plus the format's end-of-turn tokens.
        self._chat_stop_ids = {h.name: frozenset(h.eos_token_ids) | {
            self._special_id(h.name, t) for t in self.chat_format.stop_tokens}
            for h in manifest.heads}
        log.info("chat format: %s (implicit stops: tokens %s, strings %s)",
                 self.chat_format.name, list(self.chat_format.stop_tokens),
                 list(self.chat_format.stop_strings))

    def close(self) -> None:
        self.encoder.close()

    @property
    def structured_output_status(self) -> str:
        """"off" on a backend that serves none, else the grammar compiler's status."""
        return "off" if self.grammars is None else self.grammars.status

    def pinned_head(self, model: str) -> str | None:
        name, sep, head = model.partition(":")
        if name != self.manifest.model_name:
            raise NotFound(f"model '{model}' does not exist", param="model")
        if not sep:
            return None
        if head not in self.manifest.head_names:
            raise NotFound(
                f"head '{head}' does not exist; heads: {', '.join(self.manifest.head_names)}",
                param="model",
            )
        return head

    async def completion(self, body: CompletionRequest,
                         session: str | None = None) -> RequestPlan:
        """`session`: the client's conversation id (x-session-id), for session affinity."""
        self._check_shape(body)
        self._check_stream_options(body)
        if body.suffix is not None:
            raise BadRequest("suffix is not supported", param="suffix")
        if (body.best_of or 1) > 1:
            raise BadRequest("best_of is not supported; use n", param="best_of")
        token_prompts = body.token_prompts()
        if token_prompts is not None:
            return await self._token_ids(body, token_prompts, session)
        texts = body.prompts()
        if not texts:
            raise BadRequest("prompt must not be empty", param="prompt")
        return await self._plan("completion", "/v1/completions", body, texts,
                                chat=False, logprobs=body.logprobs is not None, session=session)

    async def _token_ids(self, body: CompletionRequest, prompts: list[list[int]],
                   session: str | None) -> RequestPlan:
        """A prompt given as token ids: they mean something under one head's tokenizer
        only, so the request must pin it. Planned as its decoded text (routing, limits),
        then run on exactly the ids sent (no BOS added), which usage counts."""
        head = self.pinned_head(body.model)
        if head is None:
            raise BadRequest(
                "a prompt of token ids needs a pinned head: ids differ per head, so name one "
                f"as model '{self.manifest.model_name}:HEAD' (heads: "
                f"{', '.join(self.manifest.head_names)})", param="prompt")
        vocab = self.manifest.head(head).vocab_size
        ext = extensions(body)
        prompts = [list(ext.prompt_ids(tuple(ids), None, self.limits.max_prompt_tokens))
                   for ids in prompts]
        for ids in prompts:
            if not ids:
                raise BadRequest("a token id prompt must not be empty", param="prompt")
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise BadRequest(f"token id {bad} is outside head {head}'s vocabulary "
                                 f"[0, {vocab})", param="prompt")
            if len(ids) > self.limits.max_prompt_tokens:
                raise BadRequest(f"prompt is {len(ids)} tokens; the limit is "
                                 f"{self.limits.max_prompt_tokens}", param="prompt")
        tok = self.tokenizers[head]
        texts = [tok.decode(ids, skip_special_tokens=False) for ids in prompts]
        plan = await self._plan("completion", "/v1/completions", body, texts,
                                chat=False, logprobs=body.logprobs is not None, session=session)
        self.limits.check_context(max(len(ids) for ids in prompts),
                                  plan.jobs[0].request.max_tokens)
        n = len(plan.jobs) // len(prompts)
        jobs = tuple(dataclasses.replace(
            j, request=dataclasses.replace(j.request, prompt_ids=tuple(prompts[j.index // n])))
            for j in plan.jobs)
        # Admission counts the ids sent; they exist on this head only.
        encoded = dataclasses.replace(plan.encoded, heads={head: HeadPrompt(
            tuple(tuple(ids) for ids in prompts), tok.fallback_bytes(
                [i for ids in prompts for i in ids]))})
        return dataclasses.replace(plan, jobs=jobs, encoded=encoded,
                                   prompt_tokens=sum(len(p) for p in prompts))

    async def chat(self, body: ChatCompletionRequest, session: str | None = None,
                   route: str = "/v1/chat/completions") -> RequestPlan:
        self._check_shape(body)
        self._check_stream_options(body)
        if body.tools or body.tool_choice not in (None, "none"):
            raise BadRequest("tool calling is not supported", param="tools")
        if body.top_logprobs and not body.logprobs:
            raise BadRequest("top_logprobs needs logprobs=true", param="top_logprobs")
        text = self.chat_prompt(body.messages, body.add_generation_prompt,
                                body.continue_final_message, body.chat_template_kwargs)
        field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        return await self._plan("chat", route, body, [text], chat=True, logprobs=body.logprobs,
                                max_tokens=body.effective_max_tokens(), session=session,
                                max_tokens_field=field)

    def chat_prompt(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                    continue_final_message: bool = False,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text the model's chat template renders for `messages`."""
        clash = RESERVED_TEMPLATE_VARS & set(template_kwargs or ())
        if clash:
            raise BadRequest(f"chat_template_kwargs cannot set {', '.join(sorted(clash))}",
                             param="chat_template_kwargs")
        dicts = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in messages]
        return render_chat(dicts, self.chat_format.template, *self._bos_eos_text(),
                           add_generation_prompt, continue_final_message, template_kwargs)

    def check_prompt_bytes(self, size: int, param: str) -> None:
        if size > self.limits.max_prompt_bytes:
            raise BadRequest(f"prompt is {size} bytes; the limit is "
                             f"{self.limits.max_prompt_bytes}", param=param)

    def _check_shape(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        """Limits checked before the prompt is rendered or tokenized."""
        if body.n > self.limits.max_n:
            raise BadRequest(f"n={body.n} exceeds the limit {self.limits.max_n}", param="n")
        if isinstance(body, CompletionRequest):
            self.check_prompt_bytes(sum(len(p.encode()) for p in body.prompts()), "prompt")
        else:
            self.check_prompt_bytes(sum(len(m.text().encode()) for m in body.messages),
                                    "messages")

    async def _plan(
        self, kind: str, route: str, body: SamplingFields, texts: list[str], *,
        chat: bool, logprobs: bool, max_tokens: int | None = None, session: str | None = None,
        max_tokens_field: str = "max_tokens",
    ) -> RequestPlan:
        started = time.perf_counter()
        pinned = self.pinned_head(body.model)
        ext = extensions(body)
        max_tokens = self._max_tokens(body.max_tokens if max_tokens is None else max_tokens,
                                      ext, max_tokens_field)
        stops = body.stop_list()
        if len(stops) > self.limits.max_stop_sequences:
            raise BadRequest(f"at most {self.limits.max_stop_sequences} stop sequences",
                             param="stop")
        if ext.structured is not None:
            await self._compile(ext.structured, ext.structured_field)
        # Unpinned, the router picks among the heads that hold the named ids; an id no head
        # holds is named here, against the largest.
        largest = pinned or max(self.manifest.heads, key=lambda h: h.vocab_size).name
        check_ids_on_head(ext, largest, self.manifest.head(largest).vocab_size)
        encoded, decision = await self.route(texts, chat, max_tokens, pinned, session=session,
                                             min_vocab=ext.min_vocab,
                                             needs_logits=ext.needs_logits)
        self.tracing.annotate(head=decision.head, policy=decision.policy,
                              decision=decision.code)
        if self.observe_request is not None:
            self.observe_request(encoded.prompt_bytes, max_tokens)
        request_id = new_id("cmpl-" if kind == "completion" else "chatcmpl-")
        base_seed = body.seed if body.seed is not None else random.getrandbits(62)
        score, positions = self.prompt_bpb.request(body.prompt_bpb, self._bpb_rng)
        bound = self.router.quality_bound
        ladder = (self.ladder(decision.ladder, bound)
                  if decision.ladder and bound is not None else None)
        if ladder is not None:
            self.metrics.prompt_measurements.labels(
                decision.head, "yes" if decision.measure_prompt else "skipped").inc()
            if not decision.measure_prompt:
                ladder = dataclasses.replace(ladder, positions=0)
        template = GenerationRequest(request_id, decision.head, (), max_tokens,
                                     RowParams(body.temperature, body.top_p, body.top_k,
                                               base_seed), frozenset(), logprobs,
                                     score, positions, ladder=ladder,
                                     drafter=decision.drafter)
        jobs = self.jobs(decision.head, encoded, template, body.n, stops, ext, chat)
        self.metrics.decisions.labels(decision.head, decision.policy, decision.code).inc()
        for head in decision.request.get("excluded", {}):
            self.metrics.quality_excluded.labels(head).inc()
        log.debug("request %s -> head %s: %s", request_id, decision.head, decision.reason)
        return RequestPlan(request_id, kind, route, int(time.time()), body.model, decision,
                           _prompt_tokens(jobs, body.n), encoded.prompt_bytes,
                           tuple(jobs), logprobs,
                           bool(body.stream_options and body.stream_options.include_usage),
                           started, encoded, chat)

    async def route(self, texts: list[str], chat: bool, max_tokens: int, pinned: str | None,
                    preview: bool = False, session: str | None = None, min_vocab: int = 0,
                    needs_logits: bool = False) -> tuple[EncodedPrompt, Decision]:
        """Tokenize, then decide; a request-aware policy sees every head's tokens first, a
        pinned request or a content-blind policy only needs the chosen head's. `preview`:
        what the router would choose, without recording a decision (/tokenize). The decision
        itself always runs on the event loop: policies keep state between requests."""
        decide = self.router.preview if preview else self.router.decide
        if pinned is None and self.router.request_aware:
            with self.tracing.span("tokenize"):
                encoded = await self._encode(texts, chat, None)
            tokens = {h: HeadTokens(p.tokens, p.fallback_bytes) for h, p in encoded.heads.items()}
            features = RequestFeatures(encoded.prompt_bytes, max_tokens, None, tokens,
                                       encoded.script, session, min_vocab=min_vocab,
                                       needs_logits=needs_logits)
            with self.tracing.span("route"):
                return encoded, decide(features)
        with self.tracing.span("route"):
            decision = decide(RequestFeatures(
                sum(len(t.encode()) for t in texts), max_tokens, pinned, session=session,
                min_vocab=min_vocab, needs_logits=needs_logits))
        with self.tracing.span("tokenize"):
            return await self._encode(texts, chat, [decision.head]), decision

    async def _encode(self, texts: list[str], chat: bool,
                      heads: list[str] | None) -> EncodedPrompt:
        """Tokenize on the event loop when the prompt is short; a long one goes to a worker
        thread (the tokenizers release the GIL), so it does not stall every other request."""
        if sum(len(t) for t in texts) < OFFLOAD_CHARS:
            return self.encoder.encode(texts, chat, heads)
        return await asyncio.to_thread(self.encoder.encode, texts, chat, heads)

    def on_head(self, plan: RequestPlan, head: str) -> RequestPlan:
        """The same request moved to another head (KV spill): its prompts tokenized and its
        jobs rebuilt for `head`; the decision is the caller's to record."""
        encoded = plan.encoded
        if head not in encoded.heads:  # decided on one head's tokens only
            encoded = self.encoder.encode(encoded.texts, plan.chat, [head])
        template = dataclasses.replace(plan.jobs[0].request, request_id=plan.request_id)
        first = plan.jobs[0]
        jobs = self.jobs(head, encoded, template, plan.choices_per_prompt, first.stops,
                         first.extensions, plan.chat)
        return dataclasses.replace(plan, jobs=tuple(jobs), encoded=encoded,
                                   prompt_tokens=_prompt_tokens(jobs, plan.choices_per_prompt))

    def jobs(self, head: str, encoded: EncodedPrompt, template: GenerationRequest, n: int,
             stops: list[str] | tuple[str, ...], ext: Extensions = NO_EXTENSIONS,
             chat: bool = False) -> list[ChoiceJob]:
        """One job per choice from `head`'s ids; `template` carries the request id,
        max_tokens and sampling (its seed is the base seed). A chat reply also stops at the
        chat format's end-of-turn tokens and next-turn markers, even before min_tokens: they
        are the layout's, not the client's stops."""
        spec = self.manifest.head(head)
        eos = frozenset(spec.eos_token_ids)
        # ignore_eos drops the head's EOS ids only; the chat format's turn ends still stop.
        turn = self._chat_stop_ids[head] - eos if chat else frozenset()
        turn_stops = self.chat_format.stop_strings if chat else ()
        stop_ids = ext.stop_ids(eos) | turn
        max_tokens = template.max_tokens
        prompts = [ext.prompt_ids(ids, spec.bos_token_id, self.limits.max_prompt_tokens)
                   for ids in encoded.heads[head].ids]
        for ids in prompts:
            if len(ids) > self.limits.max_prompt_tokens:
                raise BadRequest(f"prompt is {len(ids)} tokens; the limit is "
                                 f"{self.limits.max_prompt_tokens}", param="prompt")
            self.limits.check_context(len(ids), max_tokens)
        jobs = []
        s = template.sampling
        rules = ext.rules_on(self.tokenizers[head])
        if rules.min_tokens and turn:
            rules = dataclasses.replace(rules, unmasked_stop_ids=turn)
        # A two-level reading never materialises the prompt's logits: live BPB skips it.
        score = template.score_prompt and spec.reads is None
        for p, ids in enumerate(prompts):
            job_ext = dataclasses.replace(ext, echo_text=encoded.texts[p]) if ext.echo_prompt \
                else ext
            for i in range(n):
                index = p * n + i
                sampling = RowParams(s.temperature, s.top_p, s.top_k, (s.seed + index) % 2**63)
                # One choice per prompt carries the prompt's score: the others repeat it.
                req = GenerationRequest(f"{template.request_id}-{index}", head, ids,
                                        max_tokens, sampling, stop_ids,
                                        template.want_logprobs, score and i == 0,
                                        template.score_positions, ext.top_logprobs,
                                        ext.engine_prompt_logprobs, ext.structured, rules,
                                        template.ladder, template.drafter)
                jobs.append(ChoiceJob(index, req, tuple(stops), job_ext, turn_stops))
        return jobs

    def _max_tokens(self, asked: int | None, ext: Extensions, field: str) -> int:
        """The engine's max_tokens. 0 is served only as vLLM serves it: with echo on
        /v1/completions, the prompt scored and the one token generated dropped."""
        if asked == 0 and not ext.score_only:
            raise BadRequest(f"{field} must be at least 1; 0 is served only with echo=true "
                             "on /v1/completions (the prompt scored, nothing generated)",
                             param=field)
        if asked is not None and asked > self.limits.max_model_len:
            raise BadRequest(f"{field}={asked} cannot be greater than max_model_len="
                             f"{self.limits.max_model_len}. Please request fewer output tokens.",
                             param=field)
        return 1 if ext.score_only else asked or self.limits.default_max_tokens

    async def _compile(self, spec: StructuredSpec, field: str) -> None:
        """Compile (and cache) the grammar now, off the event loop, so a bad schema is a 400
        before anything streams; the engine then finds it compiled. `field`: where the
        request gave it, which the 400 names."""
        if self.grammars is None:
            raise BadRequest("structured output is served by the local engine only",
                             param="response_format")
        try:
            await asyncio.to_thread(self.grammars.compile, spec)
        except GrammarError as e:
            raise bad_structured_output(e, spec.kind, field) from e

    def _check_stream_options(self, body: SamplingFields) -> None:
        if body.stream_options is not None and not body.stream:
            raise BadRequest("stream_options requires stream=true", param="stream_options")

    def _special_id(self, head: str, text: str) -> int:
        tid = self.tokenizers[head].token_to_id(text)
        assert tid is not None  # choose_chat_format checked it: special_on_every_head
        return tid

    def _bos_eos_text(self) -> tuple[str, str]:
        # Heads are nested, so the largest head knows every special token's text.
        spec = max(self.manifest.heads, key=lambda h: h.vocab_size)
        tok = self.tokenizers[spec.name]
        bos = tok.id_to_token(spec.bos_token_id) if spec.bos_token_id is not None else ""
        return bos or "", tok.id_to_token(spec.eos_token_ids[0]) or ""


def _prompt_tokens(jobs: list[ChoiceJob], n: int) -> int:
    """Prompt ids the engine runs, each prompt counted once (not per choice)."""
    return sum(len(j.request.prompt_ids) for j in jobs if j.index % n == 0)

"""The gateway's request path: validate, route, tokenize, then stream from the backend.

Built once in the app's lifespan and injected into the route handlers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from heads.engine.types import GenerationRequest
from heads.manifest import Manifest
from heads.prompt_encoder import EncodedPrompt, HeadPrompt, PromptEncoder
from heads.tokenizer import HeadTokenizer
from kernels.row_params import RowParams
from router.admission import Ticket
from router.policy.base import Decision
from router.profiles import HeadTokens, RequestFeatures
from router.router import Router
from router.state import LiveState
from router.step_time_fit import FittedStepTimer, StepSample
from server.admission_gate import AdmissionGate
from server.backends.base import Backend
from server.chat_template import render_chat
from server.errors import BadRequest, NotFound
from server.generation import Delta, Outcome, generate_text
from server.metrics import Metrics
from server.prompt_bpb import PromptBpbConfig, record
from server.request_context import current_request_id
from server.request_plan import ChoiceJob, RequestPlan
from server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from server.settings import Settings
from server.tracing import NO_TRACING, NoTracing

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens: int
    default_max_tokens: int
    max_stop_sequences: int
    max_model_len: int  # prompt + output tokens
    max_prompt_tokens: int  # a prompt is prefilled in one step, never chunked

    @staticmethod
    def from_settings(s: Settings, max_model_len: int) -> Limits:
        return Limits(s.max_tokens_limit, s.default_max_tokens, s.max_stop_sequences,
                      max_model_len, s.max_num_batched_tokens)


class GatewayService:
    def __init__(
        self,
        manifest: Manifest,
        tokenizers: dict[str, HeadTokenizer],
        backend: Backend,
        router: Router,
        state: LiveState,
        metrics: Metrics,
        limits: Limits,
    ) -> None:
        self.manifest = manifest
        self.tokenizers = tokenizers
        self.backend = backend
        self.router = router
        self.state = state
        self.metrics = metrics
        self.limits = limits
        self.admission: AdmissionGate | None = None  # set by server.routing when enabled
        self._tickets: dict[str, Ticket] = {}  # request_id -> its KV reservation
        self.tracing: NoTracing = NO_TRACING  # server.tracing sets it when enabled
        self.prompt_bpb = PromptBpbConfig()  # the app sets it from settings
        self._bpb_rng = random.Random()  # picks the scored share of requests ("sampled")
        self.encoder = PromptEncoder(tokenizers, {h.name: h.bos_token_id for h in manifest.heads})

    def close(self) -> None:
        self.encoder.close()

    # --- planning -------------------------------------------------------------------------

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

    def plan_completion(self, body: CompletionRequest, session: str | None = None) -> RequestPlan:
        """`session`: the client's conversation id (x-session-id), for session affinity."""
        self._reject_unsupported(body)
        if body.echo or body.suffix is not None or (body.best_of or 1) > 1:
            raise BadRequest("echo, suffix and best_of are not supported", param="echo")
        if body.logprobs not in (None, 0, 1):
            raise BadRequest("only the sampled token's logprob is available (logprobs <= 1)",
                             param="logprobs")
        token_prompts = body.token_prompts()
        if token_prompts is not None:
            return self._plan_token_ids(body, token_prompts, session)
        texts = body.prompts()
        if not texts:
            raise BadRequest("prompt must not be empty", param="prompt")
        return self._plan("completion", "/v1/completions", body, texts,
                          chat=False, logprobs=body.logprobs is not None, session=session)

    def _plan_token_ids(self, body: CompletionRequest, prompts: list[list[int]],
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
        plan = self._plan("completion", "/v1/completions", body, texts,
                          chat=False, logprobs=body.logprobs is not None, session=session)
        max_tokens = plan.jobs[0].request.max_tokens
        if max(len(ids) for ids in prompts) + max_tokens > self.limits.max_model_len:
            raise BadRequest(f"prompt + max_tokens ({max_tokens}) exceeds the model's context "
                             f"of {self.limits.max_model_len} tokens", param="max_tokens")
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

    def plan_chat(self, body: ChatCompletionRequest, session: str | None = None) -> RequestPlan:
        self._reject_unsupported(body)
        if body.tools or body.tool_choice not in (None, "none"):
            raise BadRequest("tool calling is not supported", param="tools")
        if body.response_format and body.response_format.get("type") not in (None, "text"):
            raise BadRequest("only response_format 'text' is supported", param="response_format")
        if body.top_logprobs:
            raise BadRequest("top_logprobs is not supported; use logprobs=true",
                             param="top_logprobs")
        text = self.chat_prompt(body.messages)
        return self._plan("chat", "/v1/chat/completions", body, [text],
                          chat=True, logprobs=body.logprobs,
                          max_tokens=body.effective_max_tokens(), session=session)

    def chat_prompt(self, messages: list[ChatMessage]) -> str:
        """The prompt text the model's chat template renders for `messages`."""
        dicts = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in messages]
        return render_chat(dicts, self.manifest.chat_template, *self._bos_eos_text())


    def _plan(
        self, kind: str, route: str, body: SamplingFields, texts: list[str], *,
        chat: bool, logprobs: bool, max_tokens: int | None = None, session: str | None = None,
    ) -> RequestPlan:
        started = time.perf_counter()
        pinned = self.pinned_head(body.model)
        max_tokens = max_tokens or body.max_tokens or self.limits.default_max_tokens
        if max_tokens > self.limits.max_tokens:
            raise BadRequest(f"max_tokens {max_tokens} exceeds the limit {self.limits.max_tokens}",
                             param="max_tokens")
        stops = body.stop_list()
        if len(stops) > self.limits.max_stop_sequences:
            raise BadRequest(f"at most {self.limits.max_stop_sequences} stop sequences",
                             param="stop")
        self.refresh_load()
        encoded, decision = self.route(texts, chat, max_tokens, pinned, session=session)
        self.tracing.annotate(head=decision.head, policy=decision.policy,
                              decision=decision.code)
        if self.admission is not None:
            self.admission.admission.observe_request(encoded.prompt_bytes, max_tokens)
        request_id = ("cmpl-" if kind == "completion" else "chatcmpl-") + secrets.token_hex(12)
        base_seed = body.seed if body.seed is not None else secrets.randbits(62)
        score, positions = self.prompt_bpb.request(body.prompt_bpb, self._bpb_rng)
        template = GenerationRequest(request_id, decision.head, (), max_tokens,
                                     RowParams(body.temperature, body.top_p, body.top_k,
                                               base_seed), frozenset(), logprobs,
                                     score, positions)
        jobs = self._jobs(decision.head, encoded, template, body.n, stops)
        self.metrics.decisions.labels(decision.head, decision.policy, decision.code).inc()
        for head in decision.request.get("excluded", {}):
            self.metrics.quality_excluded.labels(head).inc()
        log.debug("request %s -> head %s: %s", request_id, decision.head, decision.reason)
        return RequestPlan(request_id, kind, route, int(time.time()), body.model, decision,
                    encoded.heads[decision.head].tokens, encoded.prompt_bytes, tuple(jobs),
                    logprobs, bool(body.stream_options and body.stream_options.include_usage),
                    started, encoded, chat)

    def route(self, texts: list[str], chat: bool, max_tokens: int, pinned: str | None,
              preview: bool = False, session: str | None = None
              ) -> tuple[EncodedPrompt, Decision]:
        """Tokenize, then decide; a request-aware policy sees every head's tokens first, a
        pinned request or a content-blind policy only needs the chosen head's. `preview`:
        what the router would choose, without recording a decision (/tokenize)."""
        decide = self.router.preview if preview else self.router.decide
        if pinned is None and self.router.request_aware:
            with self.tracing.span("tokenize"):
                encoded = self.encoder.encode(texts, chat)
            tokens = {h: HeadTokens(p.tokens, p.fallback_bytes) for h, p in encoded.heads.items()}
            features = RequestFeatures(encoded.prompt_bytes, max_tokens, None, tokens,
                                       encoded.script, session)
            with self.tracing.span("route"):
                return encoded, decide(features)
        with self.tracing.span("route"):
            decision = decide(RequestFeatures(
                sum(len(t.encode()) for t in texts), max_tokens, pinned, session=session))
        with self.tracing.span("tokenize"):
            return self.encoder.encode(texts, chat, [decision.head]), decision

    def _jobs(self, head: str, encoded: EncodedPrompt, template: GenerationRequest, n: int,
              stops: list[str] | tuple[str, ...]) -> list[ChoiceJob]:
        """One job per choice from `head`'s ids; `template` carries the request id,
        max_tokens and sampling (its seed is the base seed)."""
        spec = self.manifest.head(head)
        max_tokens = template.max_tokens
        prompts = encoded.heads[head].ids
        for ids in prompts:
            if len(ids) > self.limits.max_prompt_tokens:
                raise BadRequest(f"prompt is {len(ids)} tokens; the limit is "
                                 f"{self.limits.max_prompt_tokens}", param="prompt")
            if len(ids) + max_tokens > self.limits.max_model_len:
                raise BadRequest(
                    f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the "
                    f"model's context of {self.limits.max_model_len} tokens", param="max_tokens")
        jobs = []
        s = template.sampling
        for p, ids in enumerate(prompts):
            for i in range(n):
                index = p * n + i
                sampling = RowParams(s.temperature, s.top_p, s.top_k, (s.seed + index) % 2**63)
                # One choice per prompt carries the prompt's score: the others repeat it.
                req = GenerationRequest(f"{template.request_id}-{index}", head, ids,
                                        max_tokens, sampling, frozenset(spec.eos_token_ids),
                                        template.want_logprobs, template.score_prompt and i == 0,
                                        template.score_positions)
                jobs.append(ChoiceJob(index, req, tuple(stops)))
        return jobs

    # --- KV admission -----------------------------------------------------------------------

    def _footprint(self, plan: RequestPlan, head: str | None = None) -> int:
        """KV blocks the plan's choices are expected to hold on `head` (default: its own),
        counted in that head's tokens of the prompt and its predicted output bytes/token."""
        assert self.admission is not None
        a, head = self.admission.admission, head or plan.head
        bpt = plan.predicted_bpt(head)
        n = len(plan.jobs) // max(1, len(plan.encoded.texts))  # choices per prompt
        return sum(a.footprint_blocks(head, len(ids), plan.jobs[0].request.max_tokens, n, bpt)
                   for ids in plan.encoded.heads[head].ids)

    def _used_blocks(self) -> int:
        return self.backend.kv_blocks()[0]

    async def admit(self, plan: RequestPlan) -> RequestPlan:
        """Reserve the plan's expected KV blocks: now, on another head if the policy allows
        spill, or after a bounded wait; else AdmissionRejected (429 with Retry-After)."""
        gate = self.admission
        if gate is None:
            return plan
        need = self._footprint(plan)
        ticket = gate.try_now(plan.head, need, self._used_blocks())
        if ticket is None and self.router.spill_allowed and plan.decision.policy != "request_pin":
            plan, ticket = self._spill(plan, gate)
        if ticket is None:
            ticket = await gate.wait(plan.head, need, self._used_blocks)
        self._tickets[plan.request_id] = ticket
        return plan

    def _spill(self, plan: RequestPlan, gate: AdmissionGate) -> tuple[RequestPlan, Ticket | None]:
        costs = plan.decision.costs
        excluded = plan.decision.request.get("excluded", {})
        others = sorted((h for h in self.router.routable() if h != plan.head
                         and h not in excluded), key=lambda h: costs.get(h, float("inf")))
        first = plan.jobs[0].request
        n = len(plan.jobs) // max(1, len(plan.encoded.texts))
        for head in others:
            encoded = plan.encoded
            if head not in encoded.heads:  # decided on one head's tokens only
                encoded = self.encoder.encode(encoded.texts, plan.chat, [head])
            template = dataclasses.replace(first, request_id=plan.request_id)
            jobs = self._jobs(head, encoded, template, n, plan.jobs[0].stops)
            moved = dataclasses.replace(plan, jobs=tuple(jobs), encoded=encoded,
                                        prompt_tokens=encoded.heads[head].tokens)
            ticket = gate.try_now(head, self._footprint(moved, head), self._used_blocks())
            if ticket is not None:
                decision = self.router.spill(plan.decision, head,
                                             f"{plan.head} is at its KV limit")
                self.metrics.decisions.labels(head, decision.policy, decision.code).inc()
                return dataclasses.replace(moved, decision=decision), ticket
        return plan, None

    def _release(self, plan: RequestPlan, outcomes: list[Outcome], status: str) -> None:
        ticket = self._tickets.pop(plan.request_id, None)
        if ticket is None or self.admission is None:
            return
        self.admission.release(ticket)
        if status == "200":  # aborted requests would bias the learned output ratio low
            ratio = self.admission.admission.ratio
            for job, o in zip(plan.jobs, outcomes, strict=True):
                # Bytes per max_token: what the output used of its cap, in text.
                bpt = (o.text_bytes / o.completion_tokens if o.completion_tokens
                       else plan.predicted_bpt(plan.head) or 1.0)
                ratio.observe(o.completion_tokens, job.request.max_tokens, bpt)

    def _reject_unsupported(self, body: SamplingFields) -> None:
        if body.presence_penalty or body.frequency_penalty:
            raise BadRequest("presence_penalty and frequency_penalty are not supported",
                             param="presence_penalty")
        if body.logit_bias:
            raise BadRequest("logit_bias is not supported: token ids differ per head",
                             param="logit_bias")
        if body.stream_options is not None and not body.stream:
            raise BadRequest("stream_options requires stream=true", param="stream_options")

    def _bos_eos_text(self) -> tuple[str, str]:
        # Heads are nested, so the largest head knows every special token's text.
        spec = max(self.manifest.heads, key=lambda h: h.vocab_size)
        tok = self.tokenizers[spec.name]
        bos = tok.id_to_token(spec.bos_token_id) if spec.bos_token_id is not None else ""
        return bos or "", tok.id_to_token(spec.eos_token_ids[0]) or ""

    # --- running --------------------------------------------------------------------------

    def refresh_load(self) -> None:
        loads = {h: (load.running, load.waiting) for h, load in self.backend.head_load().items()}
        self.state.set_loads(loads)
        self._calibrate()

    def _calibrate(self) -> None:
        timer = self.router.timer
        if not isinstance(timer, FittedStepTimer):
            return
        for t in self.backend.step_timings():  # empty unless the engine measures its steps
            if not t.prefill:  # the cost model describes decode steps
                timer.record(StepSample(t.groups, t.seconds))

    async def stream(self, plan: RequestPlan, outcomes: list[Outcome]) -> AsyncIterator[Delta]:
        """Merge the plan's choices into one stream of deltas, in arrival order.

        `outcomes` (one per job) collects each choice's totals for the usage block.
        """
        queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()

        async def pump(job: ChoiceJob, outcome: Outcome) -> None:
            tok = self.tokenizers[plan.head]
            try:
                async for d in generate_text(self.backend, tok, job.request, list(job.stops),
                                             job.index, outcome):
                    queue.put_nowait(d)
                queue.put_nowait(None)
            except Exception as e:  # delivered to the consumer, which re-raises it
                queue.put_nowait(e)

        tasks = [asyncio.create_task(pump(j, o)) for j, o in zip(plan.jobs, outcomes, strict=True)]
        status = "error"
        span = self.tracing.start("generate")  # not current: it spans the generator's yields
        try:
            done = 0
            while done < len(tasks):
                item = await queue.get()
                if item is None:
                    done += 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
            status = "200"
        except (asyncio.CancelledError, GeneratorExit):
            status = "499"  # client closed the request (nginx's convention)
            raise
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            span.end()
            self._release(plan, outcomes, status)
            self._account(plan, outcomes, status)

    def _account(self, plan: RequestPlan, outcomes: list[Outcome], status: str) -> None:
        m, head = self.metrics, plan.head
        m.requests.labels(plan.route, head, plan.decision.policy, status).inc()
        gen_tokens = sum(o.completion_tokens for o in outcomes)
        gen_bytes = sum(o.text_bytes for o in outcomes)
        self.tracing.annotate(head=head, policy=plan.decision.policy,
                              request_id=current_request_id() or plan.request_id,
                              prompt_tokens=plan.prompt_tokens, completion_tokens=gen_tokens,
                              status=status)
        m.tokens.labels(head, "prompt").inc(plan.prompt_tokens)
        m.tokens.labels(head, "generated").inc(gen_tokens)
        m.bytes.labels(head, "prompt").inc(plan.prompt_bytes)
        m.bytes.labels(head, "generated").inc(gen_bytes)
        firsts = [o.first_token_at for o in outcomes if o.first_token_at is not None]
        if firsts:
            m.ttft.labels(head).observe(min(firsts) - plan.started_at)
        m.e2e.labels(head).observe(time.perf_counter() - plan.started_at)
        # λ counts the text served; prompt and output bytes both pass through the head.
        self.state.add_served(head, plan.prompt_bytes + gen_bytes, plan.prompt_tokens + gen_tokens)
        if status == "200" and gen_tokens:  # what the head really packs for this script
            self.state.add_output(head, plan.encoded.script, gen_bytes, gen_tokens)
        self._account_prompt_bpb(plan, outcomes)

    def _account_prompt_bpb(self, plan: RequestPlan, outcomes: list[Outcome]) -> None:
        n = len(plan.jobs) // max(1, len(plan.encoded.texts))  # choices per prompt
        for job, o in zip(plan.jobs, outcomes, strict=True):
            if o.prompt_score is not None:
                text_bytes = len(plan.encoded.texts[job.index // n].encode())
                record(self.metrics.quality, self.state, self.manifest, self.prompt_bpb,
                       plan.head, o.prompt_score, text_bytes)

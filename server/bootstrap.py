"""Build the app from settings: `create_app(settings)` registers routes and middleware, and its
lifespan builds everything else, in dependency order, and hangs it on app.state:

backend (engine) -> router and live state -> client guard (keys, rate limits, Redis usage)
-> routing services (λ and policy store, drained heads, KV admission) -> the Gateway.

Nothing heavy happens at import time or in create_app itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from heads.checkpoint import load_metadata
from heads.engine.config import EngineConfig
from heads.engine.cpu_linear import auto_compute_dtype
from heads.engine.types import QualityLadder
from heads.errors import CheckpointError
from heads.manifest import HeadSpec, Manifest
from heads.model.weights import load_checkpoint
from heads.vocab.tokenizer import HeadTokenizer
from kernels.cache_paths import calibration_dir
from kernels.crossover_calibration import load_calibration
from kernels.devices import DeviceSpec, detect_cpu, lookup_device
from kernels.roofline import DTYPE_BYTES
from router.admission import Admission, KVBudget, OutputRatio
from router.cost import AnalyticTimer, StepTimer
from router.profiles import HeadProfile, estimate_bytes_per_token
from router.router import Router
from router.state import LiveState
from router.step_time_file import timer_from_file
from router.step_time_fit import FittedStepTimer
from router.store import PolicySync, StateSync
from server.api import (
    admin_ops,
    admin_policy,
    admin_routing,
    completions,
    health,
    models,
    scrape,
    tokenize,
)
from server.api.body_limit import BodyLimitMiddleware
from server.api.deps import HEAD_PREFIX
from server.api.errors import install_error_handlers
from server.api.ignored_fields import IgnoredFields
from server.api.middleware import GatewayMiddleware
from server.backends.base import Backend
from server.backends.factory import make_backend
from server.gateway.accounting import RequestAccounting
from server.gateway.admission_gate import AdmissionGate
from server.gateway.gateway import Gateway
from server.gateway.prompt_bpb import PromptBpbConfig
from server.gateway.request_planner import Limits, RequestPlanner
from server.model_source import resolve_model_dir
from server.ops.audit import AuditLog
from server.ops.auth import admin_keyring, client_keyring
from server.ops.client_guard import ClientGuard
from server.ops.drain_sync import DrainSync
from server.ops.lambda_store import RedisStore, make_store
from server.ops.metrics import Metrics
from server.ops.ratelimit import MemoryRateLimiter, RateLimiter, RateLimits, RedisRateLimiter
from server.ops.readiness import Lifecycle, Phase
from server.ops.redis_state import BufferedCounters, RedisHealth, connect
from server.ops.store_sync import follow_policy, sync_lambda_forever
from server.ops.tracing import setup_tracing
from server.settings import Settings

log = logging.getLogger(__name__)


# --- the model: router inputs and engine settings ---------------------------------------------

def compute_dtype(settings: Settings) -> str:
    # auto: bf16 where the engine's device has a native bf16 GEMM (as vLLM's CPU backend
    # picks for Gemma-3), fp32 elsewhere.
    return auto_compute_dtype() if settings.compute_dtype == "auto" else settings.compute_dtype


def head_profiles(manifest: Manifest, dtype: str | None = None,
                  nested_pass: bool = True, probe_every: int | None = None,
                  measure_positions: int = 64) -> list[HeadProfile]:
    """`nested_pass`: the backend reads a nested head's rows in one pass with the larger
    live heads' (the local engine); the vLLM backend's logits run per head. `probe_every`:
    the engine probes readings' decode steps this often, and measures at most
    `measure_positions` positions of a prompt (measured quality control)."""
    b = manifest.backbone
    s = DTYPE_BYTES[dtype or manifest.dtype]
    probe = 0.0 if probe_every is None else manifest.native.vocab_size / probe_every
    return [
        HeadProfile(
            name=h.name,
            # A reading's logits read its split head's V rows, plus one group per sequence.
            vocab_size=h.vocab_size if h.reads is None else manifest.head(h.reads).vocab_size,
            hidden_size=b.hidden_size,
            backbone_params=b.num_parameters(),
            kv_bytes_per_token=b.kv_bytes_per_token_per_elem * s,
            weight_bytes_per_param=s,
            # A reading emits native ids: unmeasured, it is estimated at the native V.
            bytes_per_token=(h.bytes_per_token if h.bytes_per_token is not None or h.reads is None
                             else estimate_bytes_per_token(h.vocab_size)),
            training_bytes=h.training_bytes,
            bpb=h.bpb,
            training_sunk=h.training_sunk,
            shared_rows=(h.unembedding if nested_pass and (
                h.adapter is None or h.adapter.kind == "hidden") else None),
            bpb_penalty=_penalty(manifest, h.name),
            group_rows=_group_rows(manifest, h),
            reads=h.reads,
            probe_rows=probe if h.reads is not None else 0.0,
            measure_rows=(manifest.native.vocab_size if probe and h.reads is not None
                          else 0.0),
            measure_positions=measure_positions,
        )
        for h in manifest.heads
    ]


def _group_rows(manifest: Manifest, h: HeadSpec) -> float:
    fit = manifest.penalty(h.name) if h.reads is not None else None
    return 0.0 if fit is None or fit.group_rows is None else fit.group_rows


def _penalty(manifest: Manifest, head: str) -> tuple[float, float, float] | None:
    fit = manifest.penalty(head)
    return None if fit is None else (fit.per_split, fit.per_fallback_share,
                                     fit.prior_split or 0.0)


def device_spec(name: str) -> DeviceSpec:
    return detect_cpu() if name == "auto" else lookup_device(name)


def measured_quality(settings: Settings) -> bool:
    """Whether the engine measures readings per request (the local engine serves them)."""
    return settings.quality_control == "measured" and settings.backend == "local"


def served_readings(settings: Settings, manifest: Manifest) -> list[str]:
    """The split heads whose two-level readings are served (Settings.grouped_heads)."""
    if settings.grouped_heads is not None:
        return list(settings.grouped_heads)
    return sorted(manifest.readings.values()) if settings.backend == "local" else []


def build_router(manifest: Manifest, settings: Settings) -> tuple[Router, LiveState]:
    measured = measured_quality(settings)
    profiles = head_profiles(manifest, compute_dtype(settings),
                             nested_pass=settings.backend == "local",
                             probe_every=settings.quality_probe_every if measured else None,
                             measure_positions=settings.quality_positions)
    state = LiveState.for_profiles(profiles, settings.batch_window_s, settings.prompt_bpb_alpha)
    device = device_spec(settings.device)
    # The engine's kernel crossovers on this device, so the cost model prices the same kernel,
    # and the machine's measured roofline where it was calibrated.
    kernel_cal = load_calibration(device.name, calibration_dir(settings.cache_dir))
    if kernel_cal is not None:
        device = kernel_cal.roofline(device)
    # Calibrated: engine step times (fed by the gateway) replace the analytic midpoint.
    timer: StepTimer = AnalyticTimer(device, kernel_cal)
    if settings.calibrate and settings.calibration_file is not None:  # offline samples
        timer = timer_from_file(settings.calibration_file, device, profiles, kernel_cal)
    elif settings.calibrate:
        timer = FittedStepTimer(device, profiles, kernel_cal)
    router = Router(profiles, device, state, settings.policy, timer=timer,
                    decision_log=settings.decision_log_size, measured_readings=measured)
    return router, state


def engine_config(settings: Settings, manifest: Manifest) -> EngineConfig:
    return EngineConfig(
        block_size=settings.block_size,
        kv_cache_bytes=settings.kv_cache_mb << 20,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,  # None: the backbone's context
        enable_prefix_caching=settings.prefix_caching,
        weights=settings.weights,
        num_draft_tokens=settings.num_draft_tokens,
    )


def open_backend(
    settings: Settings, model_dir: Path
) -> tuple[Manifest, dict[str, HeadTokenizer], Backend, EngineConfig]:
    """The engine and what the gateway needs of the checkpoint. The vLLM engine loads the
    weights itself, so the gateway then reads only the manifest and the tokenizers."""
    if settings.backend == "vllm":
        from server.backends.vllm.factory import make_vllm_backend

        if settings.grouped_heads:
            raise CheckpointError("grouped_heads: the vLLM backend does not serve two-level "
                                  "readings; use the local backend or drop the setting")
        manifest, tokenizers = load_metadata(model_dir)
        dtype = settings.vllm_dtype if settings.vllm_dtype != "auto" else compute_dtype(settings)
        backend: Backend = make_vllm_backend(settings, model_dir, manifest, dtype)
        return manifest, tokenizers, backend, engine_config(settings, manifest)
    ckpt = load_checkpoint(model_dir, compute_dtype=compute_dtype(settings),
                           int8=settings.weights != "bf16")
    ckpt = ckpt.with_readings(served_readings(settings, ckpt.manifest))
    econf = engine_config(settings, ckpt.manifest)
    return ckpt.manifest, ckpt.tokenizers, make_backend(settings, ckpt, econf), econf


# --- services entered in the lifespan ----------------------------------------------------------

@contextlib.asynccontextmanager
async def client_guard(app: FastAPI, settings: Settings, metrics: Metrics
                       ) -> AsyncIterator[ClientGuard]:
    """API keys and per-key rate limits; with `redis_url` the rate-limit windows and usage
    counters live in Redis, and a reconciler flushes increments buffered during outages."""
    client = connect(settings.redis_url) if settings.redis_url else None
    usage = BufferedCounters(client, RedisHealth()) if client is not None else None
    app.state.usage = usage  # /readyz and /metrics report its health
    limits = RateLimits(settings.rate_limit_rpm, settings.rate_limit_tpm)
    limiter: RateLimiter | None = None
    if limits.active:
        limiter = (RedisRateLimiter(client, limits, usage.health)
                   if client is not None and usage is not None else MemoryRateLimiter(limits))
    reconciler = None
    if usage is not None:
        await usage.ping()
        reconciler = asyncio.create_task(usage.reconcile_forever())
    try:
        yield ClientGuard(client_keyring(settings), limiter, usage, metrics)
    finally:
        if reconciler is not None:
            reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciler
        if usage is not None:
            await usage.flush()
        if client is not None:
            await client.aclose()


def admission_gate(router: Router, backend: Backend, settings: Settings) -> AdmissionGate | None:
    _, total = backend.kv_blocks()
    if not settings.admission or total <= 0:  # the echo backend has no KV cache
        return None
    # A vLLM engine reports its own block size (128 tokens on CPU); the local engine's is ours.
    block_size = backend.kv_block_size() or settings.block_size
    budget = KVBudget(settings.admission_kv_blocks or total, block_size, settings.max_num_seqs)
    ratio = OutputRatio(settings.admission_quantile, settings.admission_prior_ratio)
    admission = Admission(router.profiles, budget, ratio)
    return AdmissionGate(admission, settings.admission_queue, settings.admission_wait_s)


@dataclass(frozen=True, slots=True)
class RoutingServices:
    lambda_sync: StateSync
    policy_sync: PolicySync
    drains: DrainSync | None  # followed through Redis; None on a single replica


@contextlib.asynccontextmanager
async def routing_services(router: Router, state: LiveState, metrics: Metrics,
                           settings: Settings) -> AsyncIterator[RoutingServices]:
    """λ restored from the store, then flushed and pulled every `lambda_sync_s` and once more
    at shutdown; the policy restored (the configured one is only the first-boot default) and,
    with Redis, followed live, as are the drained heads."""
    store = make_store(settings)
    sync = StateSync(state, store)
    try:
        await asyncio.to_thread(sync.restore)
    except Exception as e:
        log.error("λ store unreachable at startup (%s); counting from zero until it is", e)
    policy = PolicySync(router, store, lambda: metrics.set_policy(
        router.policy_doc["name"], router.version, router.changed_by))
    try:
        await asyncio.to_thread(policy.restore)
    except Exception as e:
        log.error("policy store unreachable at startup (%s); using the configured policy", e)
    tasks = [asyncio.create_task(sync_lambda_forever(sync, settings.lambda_sync_s))]
    drains: DrainSync | None = None
    if isinstance(store, RedisStore):
        tasks.append(asyncio.create_task(follow_policy(policy, store)))
        drains = DrainSync(router, store.url, lambda head, drained:
                           metrics.head_up.labels(head).set(0 if drained else 1))
        try:
            await drains.restore()
        except Exception as e:
            log.error("drained heads unreadable at startup (%s); none drained here", e)
        tasks.append(asyncio.create_task(drains.follow_forever()))
    try:
        yield RoutingServices(sync, policy, drains)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await asyncio.to_thread(sync.flush)
        except Exception as e:
            log.error("final λ store flush failed: %s", e)
        if isinstance(store, RedisStore):
            store.close()
        if drains is not None:
            await drains.close()


# --- the app -------------------------------------------------------------------------------------

async def _build(app: FastAPI, settings: Settings, ops: AsyncExitStack) -> Gateway:
    model_dir = resolve_model_dir(settings.model, settings.cache_dir)
    manifest, tokenizers, backend, econf = open_backend(settings, model_dir)
    router, state = build_router(manifest, settings)
    metrics = Metrics()
    metrics.set_policy(router.policy_doc["name"], router.version, router.changed_by)
    app.state.metrics = metrics
    for head in manifest.head_names:
        metrics.head_up.labels(head).set(1)
    await backend.start()
    ops.push_async_callback(backend.stop)
    guard = await ops.enter_async_context(client_guard(app, settings, metrics))
    routing = await ops.enter_async_context(routing_services(router, state, metrics, settings))
    app.state.lambda_sync = routing.lambda_sync
    app.state.policy_sync = routing.policy_sync
    app.state.drain_sync = routing.drains
    gate = admission_gate(router, backend, settings)  # sized from the started engine's KV
    tracing, prompt_bpb = app.state.tracing, PromptBpbConfig.from_settings(settings)
    limits = Limits.from_settings(settings,
                                  backend.max_model_len() or econf.model_len(manifest.backbone))
    ladder = functools.partial(QualityLadder, positions=settings.quality_positions,
                               probe_every=settings.quality_probe_every)
    planner = RequestPlanner(manifest, tokenizers, router, metrics, limits, tracing, prompt_bpb,
                             gate.admission.observe_request if gate is not None else None,
                             backend.grammar_compiler(), settings.chat_format, ladder)
    ops.callback(planner.close)
    accounting = RequestAccounting(metrics, state, manifest, tracing, prompt_bpb)
    heads = ", ".join(f"{h.name} (V={h.vocab_size})" for h in manifest.heads)
    log.info("model %s from %s; heads: %s; policy: %s v%d", manifest.model_name, model_dir,
             heads, router.policy_doc["name"], router.version)
    return Gateway(manifest, tokenizers, backend, router, state, metrics, planner, guard, gate,
                   accounting, tracing)


def create_app(settings: Settings, *, span_exporter: Any | None = None) -> FastAPI:
    """`span_exporter` replaces the configured OpenTelemetry exporter (tests)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lifecycle: Lifecycle = app.state.lifecycle
        # Closed in reverse order of entry: the planner, routing state, client guard, engine.
        async with AsyncExitStack() as ops:
            app.state.gateway = await _build(app, settings, ops)
            # What startup built (modules, torch, tokenizers, the model: ~230k objects) lives
            # as long as the app: out of the collector's reach, a full collection stops
            # walking it (0.1-0.2 s each on a 2-core VM, every few thousand requests).
            gc.freeze()
            lifecycle.phase = Phase.READY
            log.info("polyhead listening on http://%s:%d", settings.host, settings.port)
            try:
                yield
            finally:
                lifecycle.phase = Phase.DRAINING
                gc.unfreeze()  # collectable again: an app torn down in a longer-lived process
        app.state.tracing.shutdown()  # flushes the batched spans

    app = FastAPI(title="polyhead", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.lifecycle = Lifecycle()
    app.state.usage = None  # the Redis usage counters, once the lifespan connected them
    app.state.admin_keys = admin_keyring(settings)
    app.state.ignored_fields = IgnoredFields()
    app.state.audit = AuditLog(settings.audit_log or settings.cache_dir / "audit.jsonl")
    install_error_handlers(app)
    for r in (completions.router, tokenize.router, models.router, health.router, scrape.router,
              admin_policy.router, admin_ops.router, admin_routing.router):
        app.include_router(r)
    # The same routes again, pinned by their path: left out of the OpenAPI document, which
    # would otherwise list every route twice (their schemas are the plain routes').
    for r in (completions.router, tokenize.router):
        app.include_router(r, prefix=HEAD_PREFIX, include_in_schema=False)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.cors_allow_origins:  # off by default: no CORS headers at all
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_allow_origins,
                           allow_methods=["GET", "POST"], allow_headers=["*"])
    # Outermost: the request id and latency cover every other middleware's answers too.
    app.add_middleware(GatewayMiddleware, lifecycle=app.state.lifecycle,
                       max_inflight=settings.max_inflight_requests)
    # Off by default; enabled, its server span wraps every middleware above.
    app.state.tracing = setup_tracing(app, settings, span_exporter)
    return app

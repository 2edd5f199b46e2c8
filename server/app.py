"""create_app(settings): everything is built in the lifespan and hung on app.state."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from heads.checkpoint import load_checkpoint, load_metadata
from heads.engine.config import EngineConfig
from heads.manifest import Manifest
from heads.tokenizer import HeadTokenizer
from server.audit import AuditLog
from server.auth import admin_keyring, client_keyring
from server.backends.base import Backend
from server.backends.factory import make_backend
from server.body_limit import BodyLimitMiddleware
from server.errors import install_error_handlers
from server.gateway_middleware import GatewayMiddleware
from server.ignored_fields import IgnoredFields
from server.lifecycle import Lifecycle, Phase
from server.metrics import Metrics
from server.model_source import resolve_model_dir
from server.ops_wiring import client_services
from server.prompt_bpb import PromptBpbConfig
from server.routes import (
    admin,
    admin_ops,
    admin_routing,
    health,
    metrics,
    models,
    openai_api,
    tokenize,
)
from server.routing import routing_services
from server.service import GatewayService, Limits
from server.settings import Settings
from server.tracing import setup_tracing
from server.wiring import build_router, compute_dtype, engine_config

log = logging.getLogger(__name__)


def _open_backend(
    settings: Settings, model_dir: Path
) -> tuple[Manifest, dict[str, HeadTokenizer], Backend, EngineConfig]:
    """The engine and what the gateway needs of the checkpoint. The vLLM engine loads the
    weights itself, so the gateway then reads only the manifest and the tokenizers."""
    if settings.backend == "vllm":
        from server.backends.vllm.factory import make_vllm_backend

        manifest, tokenizers = load_metadata(model_dir)
        dtype = settings.vllm_dtype if settings.vllm_dtype != "auto" else compute_dtype(settings)
        backend: Backend = make_vllm_backend(settings, model_dir, manifest, dtype)
        return manifest, tokenizers, backend, engine_config(settings, manifest)
    ckpt = load_checkpoint(model_dir, compute_dtype=compute_dtype(settings))
    econf = engine_config(settings, ckpt.manifest)
    return ckpt.manifest, ckpt.tokenizers, make_backend(settings, ckpt, econf), econf


def create_app(settings: Settings, *, span_exporter: Any | None = None) -> FastAPI:
    """`span_exporter` replaces the configured OpenTelemetry exporter (tests)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lifecycle: Lifecycle = app.state.lifecycle
        model_dir = resolve_model_dir(settings.model, settings.cache_dir)
        manifest, tokenizers, backend, econf = _open_backend(settings, model_dir)
        router, state = build_router(manifest, settings)
        metrics_ = Metrics()
        metrics_.set_policy(router.policy_doc["name"], router.version, router.changed_by)
        app.state.metrics = metrics_
        app.state.service = GatewayService(
            manifest, tokenizers, backend, router, state, metrics_,
            Limits.from_settings(settings, econf.model_len(manifest.backbone)),
        )
        app.state.service.tracing = app.state.tracing
        app.state.service.prompt_bpb = PromptBpbConfig.from_settings(settings)
        for head in manifest.head_names:
            metrics_.head_up.labels(head).set(1)
        await backend.start()
        await app.state.ops.enter_async_context(client_services(app, settings, metrics_))
        await app.state.ops.enter_async_context(routing_services(app, settings))
        lifecycle.phase = Phase.READY
        heads = ", ".join(f"{h.name} (V={h.vocab_size})" for h in manifest.heads)
        log.info("model %s from %s; heads: %s; policy: %s v%d",
                 manifest.model_name, model_dir, heads,
                 router.policy_doc["name"], router.version)
        log.info("polyhead listening on http://%s:%d", settings.host, settings.port)
        try:
            yield
        finally:
            lifecycle.phase = Phase.DRAINING
            await app.state.ops.aclose()
            await backend.stop()
            app.state.service.close()
            app.state.tracing.shutdown()  # flushes the batched spans

    app = FastAPI(title="polyhead", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.lifecycle = Lifecycle()
    app.state.ops = AsyncExitStack()  # services entered in the lifespan, closed in reverse
    app.state.admin_keys = admin_keyring(settings)
    app.state.client_keys = client_keyring(settings)
    app.state.ignored_fields = IgnoredFields()
    app.state.audit = AuditLog(settings.audit_log or settings.cache_dir / "audit.jsonl")
    install_error_handlers(app)
    for r in (openai_api.router, tokenize.router, models.router, health.router, metrics.router,
              admin.router, admin_ops.router, admin_routing.router):
        app.include_router(r)
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

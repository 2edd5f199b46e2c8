"""create_app(settings): everything is built in the lifespan and hung on app.state."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from heads.checkpoint import load_checkpoint
from server.backends.local import LocalBackend
from server.body_limit import BodyLimitMiddleware
from server.errors import install_error_handlers
from server.lifecycle import Lifecycle, Phase
from server.metrics import Metrics
from server.model_source import resolve_model_dir
from server.routes import admin, health, metrics, models, openai_api
from server.service import GatewayService, Limits
from server.settings import Settings
from server.wiring import build_router, engine_config

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lifecycle: Lifecycle = app.state.lifecycle
        model_dir = resolve_model_dir(settings.model, settings.cache_dir)
        ckpt = load_checkpoint(model_dir)
        econf = engine_config(settings, ckpt.manifest)
        backend = LocalBackend(ckpt.model, econf, settings.torch_threads)
        router, state = build_router(ckpt.manifest, settings)
        metrics_ = Metrics()
        metrics_.set_policy(router.policy_doc["name"], router.version, router.changed_by)
        app.state.metrics = metrics_
        app.state.service = GatewayService(
            ckpt.manifest, ckpt.tokenizers, backend, router, state, metrics_,
            Limits.from_settings(settings, econf.model_len(ckpt.manifest.backbone)),
        )
        await backend.start()
        lifecycle.phase = Phase.READY
        heads = ", ".join(f"{h.name} (V={h.vocab_size})" for h in ckpt.manifest.heads)
        log.info("model %s from %s; heads: %s; policy: %s v%d",
                 ckpt.manifest.model_name, model_dir, heads,
                 router.policy_doc["name"], router.version)
        log.info("polyhead listening on http://%s:%d", settings.host, settings.port)
        try:
            yield
        finally:
            lifecycle.phase = Phase.DRAINING
            await backend.stop()

    app = FastAPI(title="polyhead", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.lifecycle = Lifecycle()
    install_error_handlers(app)
    for r in (openai_api.router, models.router, health.router, metrics.router, admin.router):
        app.include_router(r)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app

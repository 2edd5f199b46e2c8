"""Optional OpenTelemetry tracing (POLYHEAD_OTEL_ENABLED), off by default.

Disabled, the gateway uses `NO_TRACING` and never imports the OpenTelemetry SDK, exporter or
instrumentation packages (the `otel` extra). Enabled, `setup_tracing` builds a TracerProvider
owned by the app (kept on app.state.tracing; no global provider is set), instruments the
FastAPI app with it, and the lifespan shuts it down. The request's server span gets the
attributes polyhead.head, polyhead.policy, polyhead.request_id and token counts; child spans
"route" (the router decision) and "generate" (the engine stream) time the two main steps.
Prompts and completions are never recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from server.settings import Settings

AttrValue = str | int | float | bool


class SpanHandle:
    """A span that is not the current one (it may outlive one step of an async generator)."""

    def end(self) -> None:
        pass


class NoTracing:
    enabled = False

    def annotate(self, **attrs: AttrValue | None) -> None:
        pass

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        yield

    def start(self, name: str) -> SpanHandle:
        return SpanHandle()

    def shutdown(self) -> None:
        pass


NO_TRACING = NoTracing()


class _OtelSpan(SpanHandle):
    def __init__(self, span: Any) -> None:
        self._span = span

    def end(self) -> None:
        self._span.end()


class OtelTracing(NoTracing):
    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace

        self.provider = provider
        self._trace = trace
        self.tracer = provider.get_tracer("polyhead")

    def annotate(self, **attrs: AttrValue | None) -> None:
        """Set attributes on the current span (the request's server span outside children)."""
        span = self._trace.get_current_span()
        if span.is_recording():
            span.set_attributes({f"polyhead.{k}": v for k, v in attrs.items() if v is not None})

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        with self.tracer.start_as_current_span(name):
            yield

    def start(self, name: str) -> SpanHandle:
        return _OtelSpan(self.tracer.start_span(name))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _exporter(settings: Settings) -> Any:
    if settings.otel_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else localhost:4318.
    return OTLPSpanExporter(endpoint=settings.otel_endpoint)


def setup_tracing(app: FastAPI, settings: Settings, exporter: Any | None = None) -> NoTracing:
    """Return NO_TRACING when disabled; else instrument `app` with its own TracerProvider.

    `exporter` replaces the configured one (tests pass an InMemorySpanExporter).
    """
    if not settings.otel_enabled:
        return NO_TRACING
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise RuntimeError(
            "POLYHEAD_OTEL_ENABLED needs the OpenTelemetry packages: "
            "pip install 'polyhead[otel]'") from e
    resource = Resource.create({"service.name": settings.otel_service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter or _exporter(settings)))
    # Per-message "http send"/"http receive" spans would be one per streamed token.
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider,
                                       exclude_spans=["receive", "send"])
    return OtelTracing(provider)

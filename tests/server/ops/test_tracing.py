"""Optional OpenTelemetry tracing: spans with the routing attributes when enabled, and no
OpenTelemetry SDK, exporter or instrumentation import when disabled (the default)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server.bootstrap import create_app
from server.settings import Settings

PROMPT = "zebra quartz marmalade"

NOT_IMPORTED = ("opentelemetry.sdk.trace", "opentelemetry.instrumentation",
                "opentelemetry.exporter")


def _settings(model_dir: Path, tmp_path: Path, **kw: object) -> Settings:
    return Settings(model=str(model_dir), cache_dir=tmp_path, torch_threads=1,
                    lambda_store=tmp_path / "lambda.json", **kw)  # type: ignore[arg-type]


async def _drive(app, path: str, body: dict) -> tuple[str, httpx.Response]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            model = (await c.get("/v1/models")).json()["data"][0]["id"]
            r = await c.post(path, json={**body, "model": model},
                             headers={"x-request-id": "trace-me-1"})
    return model, r


@pytest.mark.parametrize("stream", [False, True])
def test_request_span_has_routing_attributes_and_no_prompt(tiny_model_dir, tmp_path, stream):
    pytest.importorskip("opentelemetry.sdk.trace")
    pytest.importorskip("opentelemetry.instrumentation.fastapi")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    app = create_app(_settings(tiny_model_dir, tmp_path, otel_enabled=True),
                     span_exporter=exporter)
    _, r = asyncio.run(_drive(app, "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": 4, "stream": stream}))
    assert r.status_code == 200, r.text
    spans = exporter.get_finished_spans()  # the lifespan shut the provider down: flushed
    req = [s for s in spans if s.attributes and "polyhead.head" in s.attributes
           and "polyhead.request_id" in s.attributes]
    assert len(req) == 1, [(s.name, dict(s.attributes or {})) for s in spans]
    span = req[0]
    attrs = dict(span.attributes or {})
    assert span.name.startswith("POST")  # the server span of the instrumented app
    assert attrs["polyhead.request_id"] == "trace-me-1"
    assert attrs["polyhead.policy"]
    assert attrs["polyhead.prompt_tokens"] > 0
    assert 0 < attrs["polyhead.completion_tokens"] <= 4
    assert r.headers["x-request-id"] == "trace-me-1"
    names = {s.name for s in spans}
    assert {"route", "generate"} <= names
    children = [s for s in spans if s.name in ("route", "generate")]
    assert all(s.parent is not None and s.parent.span_id == span.context.span_id
               for s in children)
    assert all(s.resource.attributes["service.name"] == "polyhead" for s in spans)
    # Nothing from the prompt (or the completion) is recorded anywhere.
    text = r.text
    for s in spans:
        for v in [s.name, *map(str, (s.attributes or {}).values())]:
            assert "zebra" not in v and "marmalade" not in v
            for e in s.events:
                assert "zebra" not in str(dict(e.attributes or {}))
    assert "zebra" not in str(attrs) and text


def test_disabled_by_default_imports_no_otel_sdk(tiny_model_dir, tmp_path):
    assert Settings().otel_enabled is False
    code = (
        "import sys\n"
        "from server.bootstrap import create_app\n"
        "from server.settings import Settings\n"
        f"app = create_app(Settings(model={str(tiny_model_dir)!r}, cache_dir={str(tmp_path)!r}))\n"
        "assert app.state.tracing.enabled is False\n"
        f"bad = [m for m in sys.modules if m.startswith({NOT_IMPORTED!r})]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_disabled_create_app_imports_no_opentelemetry_module(tiny_model_dir, tmp_path):
    before = set(sys.modules)
    app = create_app(_settings(tiny_model_dir, tmp_path))
    new = [m for m in set(sys.modules) - before if m.startswith("opentelemetry")]
    assert new == [] and app.state.tracing.enabled is False

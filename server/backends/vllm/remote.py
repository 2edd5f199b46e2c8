"""One remote vLLM OpenAI server, reached over HTTP: prompts go as token IDs, and
`return_token_ids` brings the sampled IDs back (the gateway detokenizes itself)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from heads.errors import EngineError
from server.backends.vllm.logprobs import prompt_records
from server.backends.vllm.signals import EngineSignals, parse_signals
from server.backends.vllm.types import Chunk, ReplicaFailed, VllmParams

log = logging.getLogger(__name__)


class RemoteReplica:
    def __init__(self, url: str, heads: frozenset[str], offsets: dict[str, int],
                 model: str | None = None, connect_timeout_s: float = 2.0,
                 read_timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.name = self.url
        self.heads = heads
        self.offsets = offsets
        self.model = model  # served model name; None: the first one /v1/models lists
        self.up = False
        self.signals = EngineSignals()
        # read timeout: the longest silence between two chunks of one stream.
        self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._client = httpx.AsyncClient(base_url=self.url, timeout=self._timeout)
        await self.poll()

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise ReplicaFailed(f"{self.name}: not started")
        return self._client

    async def poll(self) -> None:
        # Polls use the connect timeout for the whole exchange: a cut-off host must be seen
        # as down within one poll interval, not after a stream's read timeout.
        quick = httpx.Timeout(self._timeout.connect or 2.0)
        try:
            health = await self.client.get("/health", timeout=quick)
            health.raise_for_status()
            if self.model is None:
                models = (await self.client.get("/v1/models", timeout=quick)).json()
                self.model = models["data"][0]["id"]
            metrics = await self.client.get("/metrics", timeout=quick)
            self.signals = parse_signals(metrics.text)
            if not self.up:
                log.info("vLLM engine %s is up (model %s)", self.name, self.model)
            self.up = True
        except (httpx.HTTPError, ReplicaFailed, KeyError, IndexError, ValueError) as e:
            if self.up:
                log.warning("vLLM engine %s is down: %r", self.name, e)
            self.up = False

    def _body(self, p: VllmParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(p.prompt_ids), "max_tokens": p.max_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            # vLLM's server refuses prompt_logprobs on a stream: such a request (an
            # evaluator's, one token long as a rule) comes back whole, as one chunk.
            "stop_token_ids": list(p.stop_token_ids), "stream": p.prompt_top is None,
            "return_token_ids": True, "skip_special_tokens": False,
            # The engine holds no tokenizer: EOS comes from stop_token_ids, and only
            # token IDs are returned.
            "ignore_eos": False,
        }
        body.update(p.shaping())
        if p.seed is not None:
            body["seed"] = p.seed
        if p.logprobs or p.top_logprobs:
            body.update(logprobs=p.top_logprobs, return_tokens_as_token_ids=True)
        if p.prompt_top is not None:
            body["prompt_logprobs"] = p.prompt_top
        return body

    async def stream(self, params: VllmParams, request_id: str) -> AsyncGenerator[Chunk, None]:
        try:
            async with self.client.stream("POST", "/v1/completions", json=self._body(params),
                                          headers={"X-Request-Id": request_id}) as resp:
                if resp.status_code >= 500:
                    raise ReplicaFailed(f"{self.name}: HTTP {resp.status_code}")
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    raise EngineError(f"vLLM engine {self.name} refused the request "
                                     f"(HTTP {resp.status_code}): {detail}")
                if params.prompt_top is not None:
                    data = json.loads(await resp.aread())
                    yield _chunk(data["choices"][0], params)
                    return
                async for line in resp.aiter_lines():
                    chunk = _parse_line(line, self.name, params)
                    if chunk is not None:
                        yield chunk
        except httpx.HTTPError as e:
            raise ReplicaFailed(f"{self.name}: {e!r}") from e


def _parse_line(line: str, name: str, params: VllmParams) -> Chunk | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    data = json.loads(line[len("data: "):])
    if "error" in data:
        raise ReplicaFailed(f"{name}: {data['error'].get('message', data['error'])}")
    return _chunk(data["choices"][0], params)


def _chunk(choice: dict[str, Any], params: VllmParams) -> Chunk:
    lp = choice.get("logprobs")
    tops = None
    if lp and params.top_logprobs:
        # With return_tokens_as_token_ids, alternatives are keyed "token_id:<id>"; ranks
        # follow their order, most likely first.
        tops = tuple(tuple((int(k.removeprefix("token_id:")), v)
                           for k, v in sorted(alts.items(), key=lambda kv: -kv[1])
                           )[:params.top_logprobs] for alts in lp["top_logprobs"])
    prompt = None
    if params.prompt_top is not None and choice.get("prompt_logprobs") is not None:
        entries = [None if e is None else {int(k): (v["logprob"], v["rank"])
                                           for k, v in e.items()}
                   for e in choice["prompt_logprobs"]]
        prompt = prompt_records(entries, params.prompt_ids, params.prompt_top)
    return Chunk(
        token_ids=tuple(choice.get("token_ids") or ()),
        logprobs=tuple(lp["token_logprobs"]) if lp and params.logprobs else None,
        finish_reason=choice.get("finish_reason"),
        tops=tops,
        prompt_lps=prompt,
    )

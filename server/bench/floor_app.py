"""The framework floor for `polyhead bench gateway`: a bare FastAPI app whose
`POST /v1/completions` parses the JSON body and returns a small OpenAI-shaped completion,
served by uvicorn with the settings `polyhead serve` uses (server.serving.serve: loop and
http implementation left to uvicorn's defaults, log_config=None, logging at WARNING so the
access log is dropped). Run: python -m server.bench.floor_app PORT
"""

from __future__ import annotations

import logging
import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def create_floor_app() -> FastAPI:
    app = FastAPI(title="polyhead-floor")

    @app.get("/readyz")
    async def readyz() -> dict:
        return {"status": "ready"}

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body.get("prompt", "")
        return JSONResponse({
            "id": "cmpl-floor", "object": "text_completion", "created": int(time.time()),
            "model": body.get("model", "floor"),
            "choices": [{"index": 0, "text": str(prompt)[:1], "logprobs": None,
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })

    return app


def main(port: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    config = uvicorn.Config(create_floor_app(), host="127.0.0.1", port=port, log_config=None)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main(int(sys.argv[1]))

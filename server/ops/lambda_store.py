"""Where λ's counters persist: a Redis store when `redis_url` is set, else a local file.

Redis layout (shared by every replica): hashes `<prefix>served_bytes` and
`<prefix>served_tokens` (head -> count), `<prefix>output_bytes` and `<prefix>output_tokens`
("head/script" -> count, the live output compression), all HINCRBY in one MULTI/EXEC, and
the string `<prefix>lambda_forecast` (absent: none).

The routing policy: hash `polyhead:policy` {version, record (JSON)}, replaced by a Lua
compare-and-set only when the new version is higher, which then PUBLISHes the version on
`polyhead:policy:changed` for the other replicas.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import redis

from router.store import Counters, FileStore, Increments, PolicyRecord, Store
from server.settings import Settings

log = logging.getLogger(__name__)


_HASHES = ("served_bytes", "served_tokens", "output_bytes", "output_tokens")

# KEYS: policy hash, channel; ARGV: version, record JSON. 1 if stored, 0 if not newer.
_SAVE_POLICY = """
local cur = redis.call('HGET', KEYS[1], 'version')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'record', ARGV[2])
redis.call('PUBLISH', KEYS[2], ARGV[1])
return 1
"""


class RedisStore:
    policy_key = "polyhead:policy"
    policy_channel = "polyhead:policy:changed"

    def __init__(self, url: str, prefix: str = "polyhead:lambda:") -> None:
        self.url = url
        # Short timeouts: the sync loop runs in a worker thread and retries next interval.
        self.client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                           decode_responses=True)
        self.prefix = prefix
        self._save_policy = self.client.register_script(_SAVE_POLICY)

    def load(self) -> Counters:
        p = self.prefix
        with self.client.pipeline(transaction=True) as pipe:
            for key in _HASHES:
                pipe.hgetall(p + key)
            pipe.get(p + "lambda_forecast")
            *hashes, forecast = pipe.execute()
        served, tokens, out_bytes, out_tokens = ({k: int(v) for k, v in h.items()}
                                                 for h in hashes)
        return Counters(served, tokens, None if forecast is None else float(forecast),
                        out_bytes, out_tokens)

    def add(self, inc: Increments) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            for key, values in zip(_HASHES, (inc.served_bytes, inc.served_tokens,
                                             inc.output_bytes, inc.output_tokens), strict=True):
                for field, v in values.items():
                    pipe.hincrby(self.prefix + key, field, v)
            pipe.execute()

    def set_forecast(self, lam: float | None) -> None:
        key = self.prefix + "lambda_forecast"
        if lam is None:
            self.client.delete(key)
        else:
            self.client.set(key, repr(float(lam)))

    def load_policy(self) -> PolicyRecord | None:
        raw = self.client.hget(self.policy_key, "record")
        return None if raw is None else PolicyRecord.from_json(json.loads(raw))

    def save_policy(self, rec: PolicyRecord) -> bool:
        done = self._save_policy(keys=[self.policy_key, self.policy_channel],
                      args=[rec.version, json.dumps(rec.to_json(), sort_keys=True)])
        return bool(done)

    def close(self) -> None:
        self.client.close()


def make_store(settings: Settings) -> Store:
    if settings.redis_url:
        log.info("λ counters in Redis")
        return RedisStore(settings.redis_url)
    path = settings.lambda_store or Path(settings.cache_dir) / "lambda.json"
    log.info("λ counters in %s", path)
    return FileStore(path)

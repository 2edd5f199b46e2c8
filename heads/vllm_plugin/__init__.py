"""vLLM plugin (entry point group `vllm.general_plugins`): registers the multi-head model.

vLLM calls `register()` in every process it starts (API server, engine core, workers), so it
must be cheap and idempotent; the model class is registered lazily by name, which keeps this
import free of torch and of vLLM's model code until a worker actually builds the model.
"""

from __future__ import annotations

from heads.vllm_plugin.layout import ARCHITECTURE

MODEL_CLASS = "heads.vllm_plugin.model:PolyheadForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)

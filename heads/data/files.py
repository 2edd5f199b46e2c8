"""The files heads/ ships in heads/data (attribution in heads/data/README.md). Code opens them
only through these names, so the wheel test can check that each one is packaged."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent
SAMPLES_DIR = DATA_DIR / "multilingual"  # <lang>.txt: held-out prose per language
TINY_CORPUS = DATA_DIR / "tiny_corpus.txt"  # the tiny model's tokenizer and ranking text
TINY_HELDOUT = DATA_DIR / "tiny_heldout.txt"
WIKI_SAMPLE_A = DATA_DIR / "wiki-sample-a.txt"  # the demo's bytes/token measurement
WIKI_SAMPLE_B = DATA_DIR / "wiki-sample-b.txt"  # held out from it: replay and bench prompts
# Token order of the Gemma-3 vocabulary, ranked on the train split of the default corpus.
GEMMA3_RANKING = DATA_DIR / "gemma3-ranking.npz"
PROMPT_BPB_PROMPTS = DATA_DIR / "prompt_bpb_prompts.json"
# The trained first level of the demo's 32k two-level reading (heads.build.reading_adapter)
# and its AdapterSpec, as `polyhead heads adapt` wrote them.
DEMO_READING_ADAPTER = DATA_DIR / "gemma3-270m-32k-reading-adapter.safetensors"
DEMO_READING_ADAPTER_SPEC = DATA_DIR / "gemma3-270m-32k-reading-adapter.json"

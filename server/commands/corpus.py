"""polyhead corpus ...: assemble the calibration / evaluation corpus."""

from __future__ import annotations

import argparse
from pathlib import Path


def _codes(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def register(sub: argparse._SubParsersAction) -> None:
    corpus = sub.add_parser("corpus", help="assemble the calibration / evaluation corpus")
    csub = corpus.add_subparsers(dest="corpus_command", required=True, metavar="CORPUS_COMMAND")
    build = csub.add_parser(
        "build", help="download the pinned sources (or read --files) and write train/held-out "
        "splits per source")
    build.add_argument("--out", type=Path,
                       help="output directory (default $POLYHEAD_CACHE_DIR/corpus, "
                       "~/.cache/polyhead/corpus)")
    build.add_argument("--files", type=Path, nargs="+", metavar="FILE",
                       help="use these text files (one source each) instead of the pinned ones")
    build.add_argument("--languages", type=_codes, metavar="LANGS",
                       help="comma-separated language codes of the pinned sources to build, "
                       "'en' for the English ones, 'all' for every language (default: en, "
                       "the English corpus the head ranking uses); e.g. de,ru,ja,zh,hi,ko")
    build.add_argument("--sources", type=_codes, metavar="NAMES",
                       help="only these sources of the chosen languages, e.g. wiki,man-de")
    build.set_defaults(run=_corpus_build)
    samples = csub.add_parser(
        "samples", help="write the committed per-language samples (heads/data/multilingual) "
        "from a built corpus's held-out splits")
    samples.add_argument("--corpus", type=Path,
                         help="built corpus directory (default: as for build)")
    samples.add_argument("--out", type=Path, help="default heads/data/multilingual")
    samples.add_argument("--max-bytes", type=int, default=10_000,
                         help="UTF-8 bytes per sample, whole paragraphs (default 10000)")
    samples.set_defaults(run=_corpus_samples)


def _corpus_build(args: argparse.Namespace) -> None:
    from heads.corpus.builder import build_corpus
    from kernels.cache_paths import corpus_dir
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    out = args.out or corpus_dir()
    summaries = build_corpus(out, args.files, languages=args.languages, names=args.sources)
    print(f"{'source':<12}{'lang':<7}{'docs':>9}{'train MB':>10}{'heldout MB':>12}  origin")
    for s in summaries:
        print(f"{s.name:<12}{s.language:<7}{sum(s.documents.values()):>9}"
              f"{s.bytes['train'] / 1e6:>10.2f}{s.bytes['heldout'] / 1e6:>12.2f}  {s.origin}")
    print(f"wrote {out}")


def _corpus_samples(args: argparse.Namespace) -> None:
    from heads.corpus.builder import select_sources
    from heads.corpus.languages import write_samples
    from heads.data.files import SAMPLES_DIR
    from kernels.cache_paths import corpus_dir
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    corpus = args.corpus or corpus_dir()
    # English comes from the wiki source (the eval domain); other languages from their one
    # source each. Languages whose held-out split is not built are skipped.
    chosen = {"en": "wiki"} | {s.language: s.name for s in select_sources(["all"])
                              if s.language != "en"}
    present = {lang: name for lang, name in chosen.items()
               if (corpus / f"{name}.heldout.txt").is_file()}
    out = args.out or SAMPLES_DIR
    written = write_samples(corpus, present, out, args.max_bytes)
    for lang, n in written.items():
        print(f"{lang:<7}{present[lang]:<12}{n:>7} bytes")
    print(f"wrote {out}")

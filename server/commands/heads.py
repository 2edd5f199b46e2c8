"""polyhead heads ...: inspect checkpoints and their heads."""

from __future__ import annotations

import argparse
from pathlib import Path

from server.commands import heads_adapt


def register(sub: argparse._SubParsersAction) -> None:
    heads = sub.add_parser("heads", help="inspect checkpoints and their heads")
    hsub = heads.add_subparsers(dest="heads_command", required=True, metavar="HEADS_COMMAND")
    inspect = hsub.add_parser("inspect", help="validate a checkpoint and list its heads")
    inspect.add_argument("dir", type=Path, help="checkpoint directory")
    inspect.set_defaults(run=_heads_inspect)
    _register_build(hsub)
    _register_eval(hsub)
    heads_adapt.register(hsub)
    fit = hsub.add_parser(
        "fit-penalty", help="fit the router's per-request BPB penalty model to an evaluation")
    fit.add_argument("eval", type=Path, metavar="EVAL_BY_SOURCE_JSON",
                     help="eval-by-source.json written by `heads eval` (e.g. --languages all)")
    fit.add_argument("--bounds", default="0.05,0.1,0.15,0.25,0.5",
                     help="max_bpb_loss values to show which heads each would exclude")
    fit.add_argument("--store", type=Path, metavar="CHECKPOINT",
                     help="also store each head's own fit in this checkpoint's manifest (the "
                     "router's quality bound reads it from there)")
    fit.set_defaults(run=_heads_fit_penalty)


def _sizes(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from None


def _register_build(hsub: argparse._SubParsersAction) -> None:
    build = hsub.add_parser(
        "build", help="add nested heads by vocabulary trimming (Matryoshka order)")
    build.add_argument("src", type=Path, help="source checkpoint (its largest head is native)")
    build.add_argument("--sizes", type=_sizes, required=True,
                       help="vocabulary sizes of the new heads, e.g. 32768,131072")
    rank = build.add_mutually_exclusive_group(required=True)
    rank.add_argument("--corpus", type=Path, nargs="+", metavar="FILE",
                      help="text files to rank tokens on (e.g. the corpus *.train.txt)")
    rank.add_argument("--ranking", type=Path,
                      help="a saved token ranking (.npz) instead of a corpus")
    build.add_argument("--out", type=Path, required=True, help="output checkpoint directory")
    build.add_argument("--save-ranking", type=Path, metavar="FILE",
                       help="with --corpus: also write the ranking here")
    _ranking_options(build)
    build.add_argument("--trim", choices=("split", "merges"), default="split",
                       help="how a smaller head spells text: 'split' keeps the native "
                       "segmentation and re-spells removed tokens in kept ones (default); "
                       "'merges' filters the BPE merges (boundaries can move)")
    build.add_argument("--spelling", choices=("bpe", "fewest"), default="bpe",
                       help="with --trim split: re-spell a removed token as the head's "
                       "merge-filtered BPE spells its text alone ('bpe', default), or in the "
                       "fewest kept tokens")
    build.add_argument("--fit-penalty", action=argparse.BooleanOptionalAction, default=True,
                       help="evaluate the new heads on the committed per-language samples and "
                       "store each head's fitted BPB penalty (the router's quality bound) in "
                       "the manifest (default on; about two minutes for Gemma-3-270M)")
    build.add_argument("--fit-bytes", type=int, default=None, metavar="N",
                       help="with --fit-penalty: bytes of each language's sample (default "
                       "1024)")
    build.set_defaults(run=_heads_build)
    rank = hsub.add_parser("rank", help="rank a checkpoint's native tokens on a corpus and "
                           "save the order (.npz) for `heads build --ranking`")
    rank.add_argument("src", type=Path, help="checkpoint whose largest head is ranked")
    rank.add_argument("--corpus", type=Path, nargs="+", metavar="FILE", required=True,
                      help="text files, one source each (e.g. the corpus *.train.txt)")
    rank.add_argument("--out", type=Path, required=True, help="ranking file to write")
    _ranking_options(rank)
    rank.set_defaults(run=_heads_rank)


def _ranking_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source-weights", default="english-first", metavar="SPEC",
                   help="how much each corpus file counts: 'english-first' (default: English "
                   "sources by expected traffic, 10%% spread over other languages), "
                   "'balanced' (each language equal), 'equal' (each file equal), or "
                   "NAME=W,... (e.g. wiki=3,gcide=1)")
    p.add_argument("--specials-last", action=argparse.BooleanOptionalAction, default=None,
                   help="rank unused special tokens after all ordinary ones (default: on "
                   "above 65536 ids); BOS/EOS/pad/chat-turn specials stay first")


def _weights(args: argparse.Namespace):  # -> SourceWeights
    from heads.build.ranking import SourceWeights

    try:
        return SourceWeights.parse(args.source_weights)
    except ValueError as e:
        raise SystemExit(f"polyhead: --source-weights: {e}") from None


def _languages(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _register_eval(hsub: argparse._SubParsersAction) -> None:
    ev = hsub.add_parser("eval", help="measure bytes/token and BPB per head and source")
    ev.add_argument("dir", type=Path, help="checkpoint directory")
    what = ev.add_mutually_exclusive_group(required=True)
    what.add_argument("--corpus", type=Path, nargs="+", metavar="HELDOUT",
                      help="held-out text files, one source each (e.g. *.heldout.txt)")
    what.add_argument("--languages", type=_languages, metavar="LANGS",
                      help="the committed per-language samples (heads/data/multilingual), "
                      "comma-separated codes such as en,de,ja, or 'all'")
    ev.add_argument("--max-bytes", type=int, default=100_000,
                    help="bytes per source evaluated (whole documents; default 100000)")
    ev.add_argument("--window-bytes", type=int, default=2048,
                    help="score fixed byte windows of this size, each on its own with BOS, so "
                    "every head sees the same context (default 2048; 0: token windows of "
                    "--window tokens instead)")
    ev.add_argument("--window", type=int, default=512,
                    help="with --window-bytes 0: tokens per window incl. BOS")
    ev.add_argument("--heads", type=_languages, metavar="NAMES",
                    help="only these heads, comma-separated (ratios are then to the largest "
                    "one scored, not necessarily the native head)")
    ev.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    ev.add_argument("--compute-dtype", choices=("float32", "bfloat16", "float16"),
                    help="run the weights in this dtype (default: the checkpoint's)")
    ev.add_argument("--round-logits", action="store_true",
                    help="round each logit to the compute dtype after the fp32 product, as "
                    "the CPU engine's packed bf16 rows serve them (default: fp32 logits)")
    ev.add_argument("--update", action=argparse.BooleanOptionalAction, default=False,
                    help="record the aggregate bytes/token and BPB in the checkpoint's "
                    "manifest (default --no-update: measuring never rewrites it)")
    ev.add_argument("--grouped", action="store_true",
                    help="also score each boundary-preserving head as the first level of a "
                    "two-level softmax over the native vocabulary (rows named HEAD+groups; "
                    "measured only, not served)")
    ev.add_argument("--out", type=Path, help="where eval*.json/eval*.png go (default DIR/eval)")
    ev.set_defaults(run=_heads_eval)


def _heads_build(args: argparse.Namespace) -> None:
    from heads.build.nested import build_heads
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    m = build_heads(args.src, args.out, args.sizes, corpus=args.corpus, ranking=args.ranking,
                    specials_last=args.specials_last, save_ranking_to=args.save_ranking,
                    weights=_weights(args), trim=args.trim, spelling=args.spelling)
    print(f"wrote {args.out}: heads " + ", ".join(f"{h.name} (V={h.vocab_size})"
                                                 for h in m.heads))
    if args.fit_penalty:
        from server.model_source import PENALTY_BYTES, fit_penalties

        fits = fit_penalties(args.out, max_bytes=args.fit_bytes or PENALTY_BYTES)
        for head, f in fits.items():
            print(f"{head}: BPB penalty {f.per_split:.3g} x split share + "
                  f"{f.per_fallback_share:.3g} x byte-token share (mean abs error "
                  f"{f.mean_abs_error:.3f} over {f.points} languages)")


def _heads_rank(args: argparse.Namespace) -> None:
    from heads.build.nested import rank_checkpoint
    from heads.build.ranking import save_ranking
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    rk = rank_checkpoint(args.src, args.corpus, _weights(args), args.specials_last)
    save_ranking(args.out, rk)
    print(f"wrote {args.out}: {len(rk.order)} ids ranked on {rk.source}")


def _heads_eval(args: argparse.Namespace) -> None:
    import torch

    from heads.corpus.languages import languages, sample_path
    from heads.eval.measure import AGGREGATE, KINDS, aggregate, by_source
    from heads.eval.report import run_eval
    from heads.eval.targets import quality_targets
    from server.commands.errors import CliError
    from server.ops.logging_setup import configure_logging

    configure_logging("text", "INFO")
    if args.grouped and not args.window_bytes:
        raise CliError("--grouped scores byte windows: it needs --window-bytes > 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.languages is not None:
        langs = list(languages()) if args.languages == ["all"] else args.languages
        files = [sample_path(lang) for lang in langs]
    else:
        files = args.corpus
    results, png = run_eval(args.dir, files, args.max_bytes, args.window, args.out,
                            args.compute_dtype, window_bytes=args.window_bytes or None,
                            update_manifest=args.update, only=args.heads,
                            grouped=args.grouped, round_logits=args.round_logits)
    print(f"{'head':<11}{'V':>8}  {'source':<12}{'bytes/tok':>10}{'BPB':>8}"
          f"{'prefill tok/s':>15}{'≠native':>9}{'bytefb':>8}")
    for r in [*results, *aggregate(results)]:
        label = r.source if r.source != AGGREGATE else "ALL"
        print(f"{r.head:<11}{r.vocab_size:>8}  {label:<12}{r.bytes_per_token:>10.3f}"
              f"{r.bpb:>8.4f}{r.prefill_tokens_per_s:>15.0f}{r.differing_fraction:>9.1%}"
              f"{r.byte_fallback_share:>8.1%}")
    table = by_source(results)
    heads = list(next(iter(table.values())))
    print()
    print(f"{'source':<12}" + "".join(f"{h + ' B/tok':>12}{h + ' BPB':>11}" for h in heads)
          + "".join(f"{h + '/native':>12}" for h in heads[:-1]))
    for source, row in table.items():
        print(f"{source:<12}" + "".join(f"{row[h]['bytes_per_token']:>12.3f}"
                                        f"{row[h]['bpb']:>11.4f}" for h in heads)
              + "".join(f"{row[h]['bpb_vs_native']:>12.3f}" for h in heads[:-1]))
    print(f"\nBPB by kind of token ({', '.join(KINDS)}; sums to the head's BPB)")
    for source, row in table.items():
        print(f"{source:<12}" + "  ".join(
            f"{h}: " + "/".join(f"{row[h]['bpb_by_kind'][k]:.3f}" for k in KINDS)
            for h in heads if row[h]["bpb_by_kind"]))
    for line in quality_targets(table):
        print(line)
    print(f"plot: {png} and {png.with_name('eval-by-source.png')}"
          + ("; manifest updated" if args.update else ""))


def _heads_inspect(args: argparse.Namespace) -> None:
    from heads.checkpoint import describe_checkpoint

    print(describe_checkpoint(args.dir))


def _heads_fit_penalty(args: argparse.Namespace) -> None:
    import json

    from router.segmentation import PenaltyFit, fit_points
    from server.commands.errors import CliError

    try:
        table = json.loads(args.eval.read_text())
    except (OSError, ValueError) as e:
        raise CliError(f"{args.eval}: {e}") from e
    vocab = {h: int(x["vocab_size"]) for row in table.values() for h, x in row.items()}
    points = fit_points(table, vocab)
    if not points:
        raise CliError(f"{args.eval}: no source has two heads to compare")
    fit = PenaltyFit.fit([(x, f, y) for _, _, x, f, y in points])
    bounds = [float(b) for b in args.bounds.split(",") if b.strip()]
    print(f"{'source':8} {'head':6} {'split':>6} {'fallback':>8} {'measured':>9} "
          f"{'predicted':>9}  excluded at max_bpb_loss")
    for source, head, split, fallback, observed in points:
        pred = fit.penalty(split, fallback)
        out = " ".join(f"{b:g}" for b in bounds if pred > b)
        print(f"{source:8} {head:6} {split:6.3f} {fallback:8.3f} {observed:+9.1%} "
              f"{pred:+9.1%}  {out or '-'}")
    mae = sum(abs(fit.penalty(x, f) - y) for _, _, x, f, y in points) / len(points)
    print(f"\nPenaltyFit(per_split={fit.per_split:.3g}, per_fallback_share="
          f"{fit.per_fallback_share:.3g}) over {len(points)} points; mean absolute error "
          f"{mae:.3f}")
    if args.store is not None:
        from server.model_source import store_penalties

        for head, f in store_penalties(args.store, table).items():
            print(f"stored {head}: {f.per_split:.3g} x split + {f.per_fallback_share:.3g} x "
                  f"fallback (mean abs error {f.mean_abs_error:.3f}, {f.points} languages)")

"""The PNGs of `polyhead heads eval`: per head across V, and per source (language)."""

from __future__ import annotations

from pathlib import Path

from heads.evaluate import AGGREGATE, HeadSourceResult, aggregate


def plot(results: list[HeadSourceResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    all_rows = [*results, *aggregate(results)]
    for source in dict.fromkeys(r.source for r in all_rows):
        rs = sorted((r for r in all_rows if r.source == source), key=lambda r: r.vocab_size)
        style = {"linewidth": 2.5, "color": "black"} if source == AGGREGATE else {}
        vs = [r.vocab_size for r in rs]
        axes[0].plot(vs, [r.bytes_per_token for r in rs], marker="o", label=source, **style)
        axes[1].plot(vs, [r.bpb for r in rs], marker="o", label=source, **style)
    for ax, ylabel in zip(axes, ("bytes / token", "bits / byte"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("head vocabulary size V")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("per-head compression and BPB on held-out text")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_by_source(results: list[HeadSourceResult], path: Path) -> None:
    """Grouped bars: per source (language), BPB and bytes/token of each head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(dict.fromkeys(r.source for r in results))
    heads = sorted({(r.vocab_size, r.head) for r in results})
    width = 0.8 / len(heads)
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 0.75 * len(sources) + 2), 7), sharex=True)
    cell = {(r.source, r.head): r for r in results}
    for k, (_, head) in enumerate(heads):
        xs = [i + (k - (len(heads) - 1) / 2) * width for i in range(len(sources))]
        rs = [cell[(s, head)] for s in sources]
        axes[0].bar(xs, [r.bpb for r in rs], width, label=head)
        axes[1].bar(xs, [r.bytes_per_token for r in rs], width, label=head)
    axes[0].set_ylabel("bits / byte")
    axes[1].set_ylabel("bytes / token")
    axes[1].set_xticks(range(len(sources)), sources)
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, title="head")
    fig.suptitle("per-head BPB and compression by source")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The `polyhead` command line. Each command group lives in server/commands/."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from heads.errors import HeadsError
from kernels.errors import KernelError
from router.errors import RouterError
from server.commands import bench, corpus, export, heads, kernels, model, plan, serve, simulate
from server.commands.errors import CliError

# Command groups in `--help` order; each module has `register(subparsers)`.
COMMANDS = (serve, model, heads, corpus, kernels, simulate, plan, bench, export)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyhead", description="Multi-vocabulary LLM gateway.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except (CliError, HeadsError, KernelError, RouterError, FileNotFoundError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ValidationError):
            first = e.errors()[0]
            message = f"setting {'.'.join(map(str, first['loc']))}: {first['msg']}"
        print(f"polyhead: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

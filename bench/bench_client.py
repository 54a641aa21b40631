"""Runs `vllm bench serve` several times in one process (started by bench/serve_bench.py).

Each line on stdin is a JSON list: the arguments of one `vllm bench serve`
call. They are parsed by vLLM's own parser (vllm.benchmarks.serve.add_cli_args)
and run by its own main(), exactly as `vllm bench serve ARGS` does, so results
are identical; what this saves is importing vLLM (torch, transformers) again
for every tier. After each call one line `@@bench-done@@ {"rc": 0|1, "error": ...}`
goes to stdout. EOF ends the process.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback

MARK = "@@bench-done@@"


def main() -> int:
    try:
        import pandas  # noqa: F401 - the custom (jsonl) dataset of vllm bench serve reads with pandas
    except ImportError:
        why = "pandas is missing: vllm bench serve needs it for jsonl datasets"
        print(f"{MARK} {json.dumps({'rc': 1, 'error': why})}", flush=True)
        return 1
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    print(f"{MARK} {json.dumps({'rc': 0, 'ready': True})}", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        argv = json.loads(line)
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        status = {"rc": 0}
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv)
        except SystemExit as e:  # argparse errors
            sys.stderr.write(err.getvalue())
            lines = err.getvalue().strip().splitlines() or [f"exit {e.code}"]
            print(f"{MARK} {json.dumps({'rc': 1, 'error': lines[-1]})}", flush=True)
            continue
        try:
            bench_main(args)
        except SystemExit as e:
            status = {"rc": 1, "error": f"vllm bench serve exited with {e.code}"}
        except Exception as e:  # noqa: BLE001 - reported to the driver, which records it
            traceback.print_exc()
            status = {"rc": 1, "error": f"{type(e).__name__}: {e}"[:500]}
        sys.stdout.flush()
        sys.stderr.flush()
        print(f"{MARK} {json.dumps(status)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

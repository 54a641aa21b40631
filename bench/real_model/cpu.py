"""The CPU route: ``forward.Model`` with each KV format, on the tasks of ``tasks``, at <= 1K tokens.

Attention and the KV round trip run on the torch references (``kernels.kv_quant.reference``) for the bulk of the
numbers; the ``kernels`` section runs the project's cache-write, prefill and decode kernels in Triton's interpreter
(``TRITON_INTERPRET=1``) on short windows (the interpreter takes ~1-3 min per 128-token forward of 30 layers on two
cores) and reports each format against bf16 through the kernels, and each format's kernel route against its torch
route.
"""
from __future__ import annotations

import time

import torch

from . import forward, tasks

REF = "auto"


def greedy(model: forward.Model, prompt: list[int], kv: str, new_tokens: int, eos: int | None = None,
           attn: str = "torch") -> list[int]:
    """Greedy continuation of ``prompt`` through a cache of format ``kv``."""
    caches = model.new_caches(kv, attn, len(prompt) + new_tokens)
    ids = torch.tensor(prompt)
    logits = model.forward(ids, caches)
    out = [int(logits[-1].argmax())]
    pos = len(prompt)
    while len(out) < new_tokens and out[-1] != eos:
        logits = model.forward(torch.tensor(out[-1:]), caches, start=pos)
        pos += 1
        out.append(int(logits[-1].argmax()))
    return out


def perplexity_section(model, ids: list[int], kvs, context: int, count: int, log) -> dict:
    per = {kv: [] for kv in kvs}
    ppl_windows = {kv: [] for kv in kvs}
    for i, win in enumerate(tasks.windows(ids, context, count)):
        x = torch.tensor(win)
        ref = model.forward(x, model.new_caches(REF))
        for kv in kvs:
            logits = ref if kv == REF else model.forward(x, model.new_caches(kv))
            m = tasks.window_metrics(ref, logits, x)
            per[kv].append(m)
            ppl_windows[kv].append(float(torch.exp(tasks.nll(logits, x).mean())))
        log(f"ppl {context}: window {i + 1}/{count} " + " ".join(f"{kv}={ppl_windows[kv][-1]:.3f}" for kv in kvs))
    out = {}
    for kv in kvs:
        pooled = tasks.pool(per[kv])
        ratios = [a / b for a, b in zip(ppl_windows[kv], ppl_windows[REF])]
        out[kv] = dict(pooled, window_ppl=ppl_windows[kv], window_ratio=ratios,
                       ppl_ratio=pooled["all"]["ppl"] / tasks.pool(per[REF])["all"]["ppl"])
    return out


def greedy_section(model, ids, kvs, count, prompt_len, new_tokens, log, eos=None) -> dict:
    prompts = tasks.greedy_prompts(ids, count, prompt_len)
    gens = {kv: [greedy(model, p, kv, new_tokens, eos) for p in prompts] for kv in kvs}
    out = {kv: tasks.compare_greedy(gens[REF], gens[kv]) for kv in kvs}
    log("greedy: " + " ".join(f"{kv}={out[kv]['agreement']:.3f}" for kv in kvs))
    return out


def answer_section(model, tok, prompts, kvs, log, label, new_tokens=tasks.ANSWER_TOKENS) -> dict:
    out = {}
    eos = tok.convert_tokens_to_ids(tasks.END_OF_TURN)
    for kv in kvs:
        texts = [tok.decode(greedy(model, p["ids"], kv, new_tokens, eos), skip_special_tokens=True)
                 for p in prompts]
        out[kv] = dict(tasks.score_answers(prompts, texts), answers=texts)
        log(f"{label} {kv}: {out[kv]['hits']}/{out[kv]['n']}")
    return out


def kernel_section(model, ids, kvs, length: int, count: int, log) -> dict:
    """Each format through the real kernels (interpreter) against bf16 through them, and against its torch route."""
    per_k = {kv: [] for kv in kvs}
    cross = {kv: [] for kv in kvs}
    for win in tasks.windows(ids, length, count):
        x = torch.tensor(win)
        ref_k = model.forward(x, model.new_caches(REF, "kernels", length))
        for kv in kvs:
            t0 = time.time()
            lk = ref_k if kv == REF else model.forward(x, model.new_caches(kv, "kernels", length))
            lt = model.forward(x, model.new_caches(kv))
            per_k[kv].append(tasks.window_metrics(ref_k, lk, x))
            cross[kv].append(tasks.window_metrics(lt, lk, x))
            log(f"kernels {length}: {kv} in {time.time() - t0:.0f} s")
    return {kv: dict(vs_bf16_kernels=tasks.pool(per_k[kv])["all"], vs_torch_route=tasks.pool(cross[kv])["all"])
            for kv in kvs}


def run(model, tok, text: str, args, log) -> dict:
    ids = tasks.tokenize(tok, text)
    kvs = [REF] + [k for k in args.kv if k != REF]
    doc = dict(tokens_in_text=len(ids), kv=kvs, sections={})
    t0 = time.time()
    doc["sections"]["perplexity"] = {str(c): perplexity_section(model, ids, kvs, c, args.windows, log)
                                     for c in args.contexts}
    if args.prompts:
        doc["sections"]["greedy"] = greedy_section(model, ids, kvs, args.prompts, args.prompt_len, args.new_tokens,
                                                   log)
    paras = tasks.filler_paragraphs(text)
    for task in args.tasks:
        res = {}
        for c in args.retrieval_contexts:
            prompts = tasks.retrieval_prompts(tok, paras, c, args.retrieval_n, task=task)
            base = answer_section(model, tok, prompts, [REF], log, f"{task} {c}")
            if base[REF]["exact_match"] < args.min_bf16_em:  # the model cannot do it: report bf16 only, drop it
                res[str(c)] = dict(base, dropped=f"bf16 exact match {base[REF]['exact_match']:.2f} < "
                                                 f"{args.min_bf16_em}")
                continue
            res[str(c)] = dict(base, **answer_section(model, tok, prompts, kvs[1:], log, f"{task} {c}"))
        doc["sections"][task] = res
    if args.kernel_tokens:
        doc["sections"]["kernels"] = dict(tokens=args.kernel_tokens, windows=args.kernel_windows, **kernel_section(
            model, ids, kvs, args.kernel_tokens, args.kernel_windows, log))
    doc["wall_s"] = round(time.time() - t0, 1)
    return doc

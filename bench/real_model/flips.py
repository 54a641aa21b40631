"""Answers a KV format changes: for a CPU run's retrieval prompts whose answer is right with one KV format and wrong
with the other, where greedy decoding parts and how close bf16's own choice was there.

    python -m bench.real_model flips RESULTS.json [--kv int8_per_token_head] [--out DIR]

RESULTS.json is a ``bench.real_model cpu`` result with a retrieval (or aggregation) section. Its prompts are rebuilt
from their seed (``tasks.retrieval_prompts`` is deterministic), and each prompt whose exact match differs between
bf16 and ``--kv`` runs again through both caches, teacher-forced along bf16's greedy answer: the first step where
the format's greedy pick differs is where the answers part. Reported per prompt: that step, the two tokens, bf16's
logit margin between its pick and the format's (a near-tie is a small margin), and the format's margin the other
way. A flip at a margin of a few hundredths of a logit is a coin toss that any rounding can turn; a flip at several
logits is the format losing the fact. Writes ``<date>-cpu-real-model-flips-<int8-pth|fp8-pth|fp8-per-tensor>.{json,md}``
in --out (default bench/results/).
"""
from __future__ import annotations

from pathlib import Path

import torch

from . import tasks
from .report import REF, write_pair

FILE_TAG = {"int8_per_token_head": "int8-pth", "fp8_per_token_head": "fp8-pth", "fp8": "fp8-per-tensor"}


@torch.no_grad()
def divergence(model, prompt: list[int], kv: str, new_tokens: int, eos: int | None = None) -> dict | None:
    """The first step where greedy through ``kv`` picks another token than greedy through bf16, both on bf16's
    path: dict(step, ref_token, kv_token, ref_margin, kv_margin), the margins in logits (ref_margin: bf16's logit of
    its pick minus its logit of kv's pick; kv_margin the other way); None if every step agrees."""
    ref_caches, kv_caches = model.new_caches(REF), model.new_caches(kv)
    x, pos = torch.tensor(prompt), 0
    for step in range(new_tokens):
        a = model.forward(x, ref_caches, start=pos)[-1]
        b = model.forward(x, kv_caches, start=pos)[-1]
        ra, rb = int(a.argmax()), int(b.argmax())
        if ra != rb:
            return dict(step=step, ref_token=ra, kv_token=rb, ref_margin=float(a[ra] - a[rb]),
                        kv_margin=float(b[rb] - b[ra]))
        if ra == eos:
            return None
        pos += x.numel()
        x = torch.tensor([ra])
    return None


def flipped(prompts: list[dict], ref_answers: list[str], kv_answers: list[str]) -> list[int]:
    """The prompts whose exact match differs between the two lists of answers (right with one, wrong with the other)."""
    return [i for i, (p, a, b) in enumerate(zip(prompts, ref_answers, kv_answers))
            if tasks.is_right(p, a) != tasks.is_right(p, b)]


def run(model, tok, text: str, results: dict, kv: str, log) -> list[dict]:
    paras = tasks.filler_paragraphs(text)
    eos = tok.convert_tokens_to_ids(tasks.END_OF_TURN)
    rows = []
    for task in ("retrieval", "aggregation"):
        for ctx, res in results["sections"].get(task, {}).items():
            if kv not in res:
                continue
            prompts = tasks.retrieval_prompts(tok, paras, int(ctx), res[REF]["n"], task=task)
            for i in flipped(prompts, res[REF]["answers"], res[kv]["answers"]):
                p = prompts[i]
                answers = {k: res[k]["answers"][i] for k in (REF, kv)}
                d = divergence(model, p["ids"], kv, tasks.ANSWER_TOKENS, eos)
                rows.append(dict(task=task, context=int(ctx), prompt=i, answer=p["answer"], answers=answers,
                                 right={k: tasks.is_right(p, a) for k, a in answers.items()},
                                 divergence=d, ref_token=tok.decode([d["ref_token"]]) if d else None,
                                 kv_token=tok.decode([d["kv_token"]]) if d else None))
                log(f"{task} {ctx} prompt {i}: " + (f"parts at step {d['step']}, bf16 margin {d['ref_margin']:.3f}"
                                                    if d else "no divergence on bf16's path"))
    return rows


def markdown(rows: list[dict], kv: str, command: str) -> str:
    out = [f"# Retrieval answers {kv} changes (SmolLM2-135M, CPU route)", "", f"Command: `{command}`", "",
           "Each prompt whose answer is right with one format and wrong with the other, teacher-forced along bf16's "
           "greedy answer: the first step where the format's pick differs, and each side's logit margin there.", "",
           "| task | context | prompt | answer | bf16's number | right | " + kv + "'s number | right | parts at step | "
           "bf16 / " + kv + " tokens | bf16 margin | " + kv + " margin |",
           "|---|---:|---:|---|---|---|---|---|---:|---|---:|---:|"]
    for r in rows:
        d = r["divergence"]
        a = {k: tasks.first_number(v) or "(no number)" for k, v in r["answers"].items()}  # what the scoring reads
        cells = ([str(d["step"]), f"{r['ref_token']!r} / {r['kv_token']!r}", f"{d['ref_margin']:.3f}",
                  f"{d['kv_margin']:.3f}"] if d else ["-", "-", "-", "-"])
        out.append(f"| {r['task']} | {r['context']} | {r['prompt']} | {r['answer']} | {a[REF]} | {r['right'][REF]} | "
                   f"{a[kv]} | {r['right'][kv]} | " + " | ".join(cells) + " |")
    if not rows:
        out.append("(no prompt changes its answer)")
    return "\n".join(out) + "\n"


def write(rows: list[dict], kv: str, command: str, out_dir: Path) -> Path:
    return write_pair(out_dir, f"cpu-real-model-flips-{FILE_TAG[kv]}", dict(command=command, kv=kv, rows=rows),
                      markdown(rows, kv, command))

"""Deterministic long-document prompts for the three contest tiers.

The contest's throughput sets are jsonl files with one `prompt` per line: long
essays with "special magic number" needles and a question at the end. We
cannot ship those, so this module writes prompts of the same shape from the
synthetic tokenizer's English words (bench/synth_tokenizer.py): an instruction
line, paragraphs of sentences with a few needle sentences at random places,
and a closing question about one needle key.

Length: each prompt's length is counted as `vllm bench serve` counts it for
the custom dataset, i.e. tokens of the chat-templated prompt
(`apply_chat_template([user: prompt], add_generation_prompt=True)` with the
synthetic template). Targets are drawn uniformly inside the tier; the
16-32K tier stops at 32768 - 1024 so that prompt plus the contest's largest
output fits a 32768-token context.

Determinism: the text depends only on (tier, seed, index) and this file;
`prompts_sha256` of a written file is recorded in every benchmark JSON.

Usage: python -m bench.prompts OUT_DIR [--tiers 4-8K,8-16K,16-32K] [--count 64] [--seed 0]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys

from bench.synth_tokenizer import ENGLISH_WORDS, PRETOKEN_PATTERN

# Tier name -> [min, max) prompt tokens (chat-templated, as vllm bench counts them).
TIERS: dict[str, tuple[int, int]] = {
    "4-8K": (4096, 8192),
    "8-16K": (8192, 16384),
    "16-32K": (16384, 32768 - 1024),
}
DEFAULT_COUNT = 64
DEFAULT_SEED = 0

# Chat-template tokens around the user text: "<|im_start|>" "user" "\n" ... "<|im_end|>" "\n"
# "<|im_start|>" "assistant" "\n" "<think>" "\n" (thinking left on, as vllm bench renders it).
TEMPLATE_OVERHEAD = 10

_PRETOKEN = re.compile(PRETOKEN_PATTERN)
_FILLER = [w for w in ENGLISH_WORDS if w not in ("system", "user", "assistant", "tool")]
_KEY_WORDS = ["river", "lamp", "garden", "silver", "window", "orange", "falcon", "marble", "harbor", "cedar",
              "velvet", "comet", "pepper", "meadow", "copper", "lantern"]
_INTRO = ("Some special magic numbers are hidden in the text below. Read all of it and memorize every number, "
          "because a question about the numbers is asked after the text.")


def count_tokens(text: str) -> int:
    """Tokens of `text` under the synthetic tokenizer (no special tokens; exact for vocabulary text)."""
    return len(_PRETOKEN.findall(text))


def check_tiers(names: list[str]) -> list[str]:
    bad = [n for n in names if n not in TIERS]
    if bad:
        raise ValueError(f"unknown tier {','.join(bad)}; supported: {','.join(TIERS)}")
    return names


def _sentence(rng: random.Random) -> str:
    n = rng.randint(8, 22)
    words = [rng.choice(_FILLER) for _ in range(n)]
    if n > 12 and rng.random() < 0.5:
        words[rng.randint(3, n - 4)] += ","
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def make_prompt(tier: str, index: int, seed: int = DEFAULT_SEED) -> dict:
    """One prompt row: {"prompt", "tier", "index", "target_tokens", "needles", "question_key"}."""
    lo, hi = TIERS[check_tiers([tier])[0]]
    rng = random.Random(f"{seed}:{tier}:{index}")
    target = rng.randrange(lo, hi)
    keys = rng.sample(_KEY_WORDS, 4)
    needles = [{"key": k, "number": str(rng.randrange(1_000_000, 10_000_000))} for k in keys]
    asked = keys[rng.randrange(len(keys))]
    question = f"\n\nWhat are all the special magic numbers for {asked} mentioned in the text above?"
    budget = target - TEMPLATE_OVERHEAD - count_tokens(_INTRO + "\n\n") - count_tokens(question)

    # Needle sentences go at random token offsets inside the body.
    needle_text = [f"One of the special magic numbers for {n['key']} is: {n['number']}." for n in needles]
    needle_tokens = sum(count_tokens(" " + s) for s in needle_text)
    body_budget = budget - needle_tokens
    slots = sorted(rng.randrange(0, max(1, body_budget)) for _ in needle_text)

    parts: list[str] = []
    used = 0
    placed = 0
    para_left = rng.randint(4, 9)
    while True:
        while placed < len(needle_text) and used >= slots[placed]:
            piece = " " + needle_text[placed]
            parts.append(piece)
            used += count_tokens(piece)
            placed += 1
        sep = "\n\n" if para_left == 0 else " "
        if para_left == 0:
            para_left = rng.randint(4, 9)
        sentence = _sentence(rng)
        piece = (sep if parts else "") + sentence
        cost = count_tokens(piece)
        if used + cost > budget - (needle_tokens if placed < len(needle_text) else 0):
            break
        parts.append(piece)
        used += cost
        para_left -= 1
    while placed < len(needle_text):  # short tiers: the rest go at the end
        piece = " " + needle_text[placed]
        parts.append(piece)
        used += count_tokens(piece)
        placed += 1
    # Top up with single words so the length lands on the target.
    while used < budget:
        parts.append(" " + rng.choice(_FILLER))
        used += 1
    body = "".join(parts)
    prompt = _INTRO + "\n\n" + body + question
    return {
        "prompt": prompt,
        "tier": tier,
        "index": index,
        "target_tokens": target,
        "needles": needles,
        "question_key": asked,
    }


def make_prompts(tier: str, count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[dict]:
    return [make_prompt(tier, i, seed) for i in range(count)]


def templated_tokens(row: dict) -> int:
    """The prompt's length as `vllm bench serve` reports it (chat template applied, thinking default)."""
    return count_tokens(row["prompt"]) + TEMPLATE_OVERHEAD


def write_jsonl(path: str, rows: list[dict]) -> str:
    """Write rows (contest format: a `prompt` field per line plus our metadata); returns sha256 of the file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in rows).encode()
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def write_tier_files(out_dir: str, tiers: list[str], count: int = DEFAULT_COUNT,
                     seed: int = DEFAULT_SEED) -> dict[str, dict]:
    """{tier: {"path", "sha256", "count"}} for `<out_dir>/<tier>_throughput.jsonl`."""
    info = {}
    for tier in check_tiers(tiers):
        path = os.path.join(out_dir, f"{tier}_throughput.jsonl")
        sha = write_jsonl(path, make_prompts(tier, count, seed))
        info[tier] = {"path": path, "sha256": sha, "count": count, "seed": seed}
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tiers", default=",".join(TIERS))
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    a = ap.parse_args(argv)
    try:
        info = write_tier_files(a.out_dir, a.tiers.split(","), a.count, a.seed)
    except ValueError as e:
        print(f"prompts: {e}", file=sys.stderr)
        return 2
    for tier, d in info.items():
        print(f"{tier}: {d['count']} prompts -> {d['path']} sha256 {d['sha256'][:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

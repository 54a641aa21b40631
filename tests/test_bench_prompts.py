"""Prompt generator (bench/prompts.py): lengths inside each tier, determinism, needles, bad input."""
import json
import os
import subprocess
import sys

import pytest

from bench.prompts import TIERS, make_prompt, make_prompts, templated_tokens, write_tier_files
from bench.synth_tokenizer import write_tokenizer


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("synth_model")
    write_tokenizer(str(d))
    return AutoTokenizer.from_pretrained(str(d))


@pytest.mark.parametrize("tier", list(TIERS))
def test_prompt_lengths_as_vllm_bench_counts_them_fall_inside_the_tier(hf_tok, tier):
    lo, hi = TIERS[tier]
    rows = make_prompts(tier, 3)
    for r in rows:
        # vllm bench serve's custom dataset: apply the chat template, then count tokenizer(prompt).input_ids
        text = hf_tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                          tokenize=False)
        ids = hf_tok(text).input_ids
        assert lo <= len(ids) < hi
        assert len(ids) == r["target_tokens"] == templated_tokens(r)
        assert hf_tok.unk_token_id not in ids


def test_all_64_prompts_of_every_tier_stay_inside_the_tier_and_differ():
    for tier, (lo, hi) in TIERS.items():
        rows = make_prompts(tier)
        assert len(rows) == 64
        lens = [templated_tokens(r) for r in rows]
        assert min(lens) >= lo and max(lens) < hi
        assert len({r["prompt"][:400] for r in rows}) == 64  # no shared prefixes for the prefix cache
    assert TIERS["16-32K"][1] + 1024 <= 32768  # prompt + the contest's longest output fit 32K


def test_prompts_are_deterministic_per_seed(tmp_path):
    a = write_tier_files(str(tmp_path / "a"), ["4-8K"], count=4, seed=0)
    b = write_tier_files(str(tmp_path / "b"), ["4-8K"], count=4, seed=0)
    c = write_tier_files(str(tmp_path / "c"), ["4-8K"], count=4, seed=1)
    assert a["4-8K"]["sha256"] == b["4-8K"]["sha256"] != c["4-8K"]["sha256"]
    rows = [json.loads(x) for x in open(a["4-8K"]["path"])]
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in make_prompts("4-8K", 4, 0)]


def test_every_needle_is_in_the_text_and_the_question_asks_for_one():
    r = make_prompt("8-16K", 5)
    for n in r["needles"]:
        assert f"special magic numbers for {n['key']} is: {n['number']}." in r["prompt"]
    assert r["question_key"] in [n["key"] for n in r["needles"]]
    assert r["prompt"].endswith(f"magic numbers for {r['question_key']} mentioned in the text above?")


def test_unknown_tier_is_rejected_with_the_supported_list(tmp_path):
    with pytest.raises(ValueError, match="unknown tier 2-4K; supported: 4-8K,8-16K,16-32K"):
        make_prompt("2-4K", 0)
    p = subprocess.run([sys.executable, "-m", "bench.prompts", str(tmp_path), "--tiers", "4-8K,64K"],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert p.returncode == 2
    assert p.stderr.strip() == "prompts: unknown tier 64K; supported: 4-8K,8-16K,16-32K"

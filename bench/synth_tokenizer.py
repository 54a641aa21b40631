"""A synthetic word-level tokenizer for the dummy-weight Qwen3.5 model.

Dummy weights come without a tokenizer, so `vllm serve` would otherwise need
`--skip-tokenizer-init` and the benchmark would skip the chat template,
tokenization and detokenization that real users pay for. This module writes a
`tokenizer.json` (HF `tokenizers`, WordLevel model) whose vocabulary covers
every id of the model's output layer (248320), plus a `tokenizer_config.json`
with a small Qwen-style chat template. Then the whole text path of
`vllm serve` runs: chat template, tokenization, incremental detokenization,
the `qwen3` reasoning parser and the `qwen3_coder` tool parser (both find
their marker tokens in this vocabulary).

Layout of the ids (deterministic, no randomness):
- 0..: `<unk>`, newline runs, single ASCII symbols and digits (bare and with
  a leading space), English words (lower case and capitalised, bare and with
  a leading space), then generated pseudo-words ("bapo", " bapo", ...).
- 248044..248069: the Qwen special tokens in Qwen's order (`<|endoftext|>`,
  `<|im_start|>`, `<|im_end|>`, ..., `<tool_call>`, `</tool_call>`, ...,
  `<think>`, `</think>`), so the ids in the model config (eos 248044,
  vision_start 248053, image 248056, video 248057) name the same tokens as in
  the real tokenizer.
- 248070..248319: more pseudo-words, so every id the model can sample decodes
  to text.

Pre-tokenization splits text into: a word with an optional leading space, a
digit with an optional leading space, one other symbol with an optional
leading space, a run of newlines, or one other whitespace character. Decoding
concatenates the pieces, so any text made of ASCII words, digits, symbols,
spaces and newlines round-trips exactly; anything else maps to `<unk>`.

Usage: python -m bench.synth_tokenizer MODEL_DIR [--vocab-size 248320]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

VOCAB_SIZE = 248320
SPECIAL_BASE_ID = 248044

# Qwen's added tokens, in id order from SPECIAL_BASE_ID.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
# Tokens vLLM's parsers look up; the first four are "special" (stripped from
# detokenized output by default) in Qwen's tokenizer, the parser markers are not.
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

PRETOKEN_PATTERN = r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\n+|[^\S\n]"

# Words used by the prompt generator (bench/prompts.py) and the chat template.
ENGLISH_WORDS = """
a about above across after again against age air all almost alone along already also although always among an
and another answer any anyone anything are around as ask asked at away back bad be became because become been
before began begin behind being believe below best better between big book both bring build built business but
by call called came can cannot care carry case cause certain change child children city class clear close cold
come common company could country course create cut data day decide deep did different do does done door down
draw during each early earth easy either end enough even ever every example eye face fact fail fall family far
fast feel few field final find first follow food for form found free friend from full game gave general get give
given go good got great group grow had half hand happen hard has have he head hear heart help her here high him
his history hold home hope hour house how however idea if important in increase inside instead interest into is
it its itself just keep kind knew know known land language large last later lead learn least leave left less let
level life light like line list little live long look lose lot love low made magic main make man many market matter
may me mean means memorize mentioned might mind minute miss model money more most move much must my name near need
never new next night no not note nothing now number numbers of off often old on once one only open or order other
our out over own page paper part past people perhaps person place plan play point possible power present problem
program provide provided public put question quiz quite rather reach read ready real really reason remember rest
result return right room rule run said same saw say school second see seem seen sense set several shall she short
should show side simple since small so social some something sometimes soon sort special stand start state still
stop story study such sure system take talk tell test text than that the their them then there these they thing
think this those though thought three through time to together told too took toward true try turn two under
understand until up upon us use used user usually value very view want was water way we well went were what when
where whether which while who whole why will with within without word work world would write year yet you young
your assistant tool afterwards hidden following
river lamp garden silver window orange falcon marble harbor cedar velvet comet pepper meadow copper lantern
""".split()


def _pseudo_words():
    """Deterministic pronounceable pseudo-words: CV syllables, 2 then 3 then 4 per word."""
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    for n in (2, 3, 4):
        for combo in itertools.product(syllables, repeat=n):
            yield "".join(combo)


def vocab_tokens(vocab_size: int = VOCAB_SIZE) -> list[str]:
    """Token string for every id in [0, vocab_size)."""
    if vocab_size <= SPECIAL_BASE_ID + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {SPECIAL_BASE_ID + len(SPECIAL_TOKENS)}, got {vocab_size}")
    regular: list[str] = ["<unk>"]
    regular += ["\n" * k for k in range(1, 9)]
    regular += [" ", "\t", "\r"]
    symbols = [chr(c) for c in range(33, 127) if not chr(c).isalnum()]
    for s in symbols + list("0123456789"):
        regular += [s, " " + s]
    words: list[str] = []
    seen: set[str] = set()
    for w in ENGLISH_WORDS + [w.capitalize() for w in ENGLISH_WORDS] + list("abcdefghijklmnopqrstuvwxyz"):
        if w not in seen:
            seen.add(w)
            words.append(w)
    for w in words:
        regular += [w, " " + w]
    need = vocab_size - len(SPECIAL_TOKENS)
    pseudo = _pseudo_words()
    while len(regular) < need:
        w = next(pseudo)
        if w in seen:
            continue
        seen.add(w)
        regular += [w, " " + w]
    regular = regular[:need]
    head, tail = regular[:SPECIAL_BASE_ID], regular[SPECIAL_BASE_ID:]
    tokens = head + SPECIAL_TOKENS + tail
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size
    return tokens


CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """The `tokenizers.Tokenizer` described in the module docstring."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = vocab_tokens(vocab_size)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PRETOKEN_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([
        AddedToken(t, special=t not in NOT_SPECIAL, normalized=False) for t in SPECIAL_TOKENS
    ])
    return tok


def write_tokenizer(model_dir: str, vocab_size: int = VOCAB_SIZE) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into model_dir."""
    os.makedirs(model_dir, exist_ok=True)
    build_tokenizer(vocab_size).save(os.path.join(model_dir, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(model_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"}, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    a = ap.parse_args(argv)
    try:
        write_tokenizer(a.model_dir, a.vocab_size)
    except ValueError as e:
        print(f"synth_tokenizer: {e}", file=sys.stderr)
        return 2
    print(f"wrote synthetic tokenizer ({a.vocab_size} ids) to {a.model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

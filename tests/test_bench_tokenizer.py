"""Synthetic tokenizer (bench/synth_tokenizer.py): vocabulary, round trip, chat template, vLLM's parsers."""
import random

import pytest

from bench.synth_tokenizer import SPECIAL_BASE_ID, SPECIAL_TOKENS, VOCAB_SIZE, vocab_tokens, write_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth_model")
    write_tokenizer(str(d))
    return str(d)


@pytest.fixture(scope="module")
def hf_tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_vocab_covers_every_model_id_once_with_qwen_special_ids():
    toks = vocab_tokens()
    assert len(toks) == VOCAB_SIZE == 248320 and len(set(toks)) == VOCAB_SIZE
    assert toks[248044] == "<|endoftext|>"  # eos_token_id of the Qwen3.5 text config
    assert toks[248053] == "<|vision_start|>" and toks[248056] == "<|image_pad|>" and toks[248057] == "<|video_pad|>"
    assert toks[248058] == "<tool_call>" and toks[248068] == "<think>" and toks[248069] == "</think>"
    assert toks[SPECIAL_BASE_ID:SPECIAL_BASE_ID + len(SPECIAL_TOKENS)] == SPECIAL_TOKENS


def test_vocab_size_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size must exceed"):
        vocab_tokens(1000)


def test_hf_tokenizer_loads_from_model_dir_with_full_vocab(hf_tok):
    assert len(hf_tok) == VOCAB_SIZE
    assert hf_tok.eos_token == "<|im_end|>"


def test_text_round_trips_exactly_without_unknown_tokens(hf_tok):
    text = ("Some special magic numbers are hidden in the text below.\n\nOne of the special magic numbers "
            "for river is: 4417093. What are all the numbers, (if any)?\n")
    ids = hf_tok(text).input_ids
    assert hf_tok.unk_token_id not in ids
    assert hf_tok.decode(ids) == text
    assert len(ids) == 42  # each word, digit, symbol and newline run is one token


def test_unknown_characters_map_to_unk(hf_tok):
    ids = hf_tok("Hello é").input_ids
    assert ids.count(hf_tok.unk_token_id) == 2


def test_incremental_detokenization_of_random_ids_matches_full_decode(hf_tok):
    # vLLM's FastIncrementalDetokenizer drives tokenizers.DecodeStream like this.
    from tokenizers.decoders import DecodeStream

    rng = random.Random(0)
    ids = [rng.randrange(VOCAB_SIZE) for _ in range(300)]
    stream = DecodeStream(skip_special_tokens=True)
    pieces = [stream.step(hf_tok._tokenizer, i) or "" for i in ids]
    assert "".join(pieces) == hf_tok.decode(ids, skip_special_tokens=True)
    assert len("".join(pieces)) > 300


def test_chat_template_disables_thinking_like_qwen(hf_tok):
    msgs = [{"role": "user", "content": "What is the number?"}]
    off = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    on = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert off == "<|im_start|>user\nWhat is the number?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the number?"}]}]
    assert hf_tok.apply_chat_template(parts, add_generation_prompt=True, tokenize=False, enable_thinking=False) == off
    ids = hf_tok(off).input_ids
    assert ids[0] == 248045 and ids.count(248069) == 1  # <|im_start|>, </think> as single special tokens


def test_vllm_tokenizer_loader_and_official_parsers_accept_it(model_dir):
    from vllm.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser
    from vllm.tokenizers import get_tokenizer
    from vllm.tool_parsers.qwen3coder_tool_parser import Qwen3CoderToolParser

    tok = get_tokenizer(model_dir)
    assert len(tok) == VOCAB_SIZE
    rp = Qwen3ReasoningParser(tok, chat_template_kwargs={"enable_thinking": False})
    assert (rp.start_token_id, rp.end_token_id) == (248068, 248069)
    prompt_ids = tok(tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=False, enable_thinking=False)).input_ids
    assert rp.is_reasoning_end(prompt_ids)  # thinking off: the prompt already closes the think block
    tp = Qwen3CoderToolParser(tok)
    assert tp.tool_call_start_token_id == 248058

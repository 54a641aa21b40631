"""Every token id a client sends is checked against the vocabulary before the request reaches the engine core.

Patch 0008 (issue #20) calls these functions from vLLM 0.18.1's InputProcessor (vllm/v1/engine/input_processor.py),
the one place every generate request passes in the API server (OpenAI completions and chat, responses, the
Anthropic messages endpoint, /inference/v1/generate) and in the offline LLM, with or without a tokenizer. A token id
that reaches the GPU as an index must lie in [0, V), V = the model's vocabulary (model_config.get_vocab_size(): the
rows of the embedding table and the columns of the logits). Outside it, the embedding lookup (prompt ids) or a
logits index (min-tokens masking of stop ids, logit_bias, allowed_token_ids, bad words) trips a device-side assert
and the engine core dies with every request in flight. A value of the wrong type (a float, a bool, a numpy scalar)
fails msgspec's typed decode in the engine core process, or indexes a tensor wrongly, with the same result.

What is checked, and against what (FIELD_RULES holds the same table):
  prompt token ids    [0, V): every prompt (a batch's too: each is its own request), encoder and decoder. Where a
                      tokenizer is loaded 0.18.1 accepted ids up to max(tokenizer max id, V - 1), which let a
                      tokenizer larger than the model through; ids the tokenizer lacks but the model has (Qwen pads
                      its vocabulary) stay valid, as upstream decided. Positions of multimodal placeholders are
                      exempt (the model embeds those itself; some models use ids beyond V there).
  stop_token_ids      [0, V): stop ids index the logits when min_tokens > 0; an id outside can never be sampled.
  allowed_token_ids   [0, V), and [0, len(tokenizer)) where a tokenizer is loaded (upstream's rule, kept).
  logit_bias          keys in [0, V) (upstream checks the same; here with the message below), values real numbers.
  bad_words           the ids the tokenizer encodes them to, in [0, V) (upstream checks only the tokenizer's range,
                      which is larger than the model's for some models).
  seed                an integer in [-2**63, 2**64): what torch.Generator.manual_seed accepts in the engine.
  eos / generation-config stop ids (server-side, not client fields): in [0, V) when min_tokens > 0 masks them.

An id out of range or of the wrong type raises vLLM's VLLMValidationError (a ValueError; the API server answers it
with HTTP 400 and the field as `param`), or this module's RequestCheckError (a ValueError too) where vLLM is not
loaded. The message is one line naming the field, the position, the bad value and the valid range, e.g.
    stop_token_ids[1]: token id 248320 is out of range; valid token ids are integers in [0, 248320)
    (the model's vocabulary)

Pure Python: no vLLM import, so it can be unit-tested alone (tests/test_request_checks.py).
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Mapping, Sequence

SEED_MIN = -(2 ** 63)
SEED_MAX_EXCLUSIVE = 2 ** 64

FIELD_RULES = {
    "prompt_token_ids": "model vocabulary (multimodal placeholder positions exempt)",
    "stop_token_ids": "model vocabulary",
    "allowed_token_ids": "model vocabulary and, with a tokenizer, the tokenizer's (len(tokenizer))",
    "logit_bias": "keys: model vocabulary; values: real numbers",
    "bad_words": "their token ids: model vocabulary (the tokenizer's range is checked by upstream)",
    "seed": f"integer in [{SEED_MIN}, {SEED_MAX_EXCLUSIVE})",
    "min_tokens": "eos / generation-config stop ids it masks: model vocabulary",
}


class RequestCheckError(ValueError):
    """Raised where vLLM is not loaded; same constructor as vllm.exceptions.VLLMValidationError."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


def _fail(parameter: str, message: str, value: Any = None):
    # vLLM's own validation error when vLLM is loaded (sampling_params.py imports it, so it is whenever a request
    # exists): the API server maps it to HTTP 400 with `param` set. Never imported from here.
    mod = sys.modules.get("vllm.exceptions")
    cls = getattr(mod, "VLLMValidationError", None) or RequestCheckError
    raise cls(message, parameter=parameter, value=value)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _type_name(x: Any) -> str:
    t = type(x)
    mod = t.__module__
    return t.__name__ if mod in ("builtins", None) else f"{mod.split('.')[0]}.{t.__name__}"


def _short(x: Any, limit: int = 40) -> str:
    s = repr(x) if isinstance(x, (str, bytes)) else str(x)
    return s if len(s) <= limit else s[:limit - 3] + "..."


class Vocab:
    """The valid range [0, size) of one field and the words that say where it comes from."""

    __slots__ = ("size", "what")

    def __init__(self, size: int, what: str):
        self.size, self.what = size, what

    def describe(self) -> str:
        return f"integers in [0, {self.size}) ({self.what})"


def model_vocab(vocab_size: int) -> Vocab:
    if not _is_int(vocab_size) or vocab_size <= 0:
        raise ValueError(f"the model's vocabulary size must be a positive integer, got {vocab_size!r}")
    return Vocab(vocab_size, "the model's vocabulary")


def model_and_tokenizer_vocab(vocab_size: int, tokenizer_size: int | None) -> Vocab:
    """[0, min(model, tokenizer)): for fields that upstream also bounds by the tokenizer."""
    model = model_vocab(vocab_size)
    if tokenizer_size is None or tokenizer_size >= vocab_size:
        if tokenizer_size is None:
            return model
        return Vocab(vocab_size, f"the model's vocabulary; the tokenizer has {tokenizer_size}")
    return Vocab(tokenizer_size, f"the tokenizer's vocabulary; the model has {vocab_size}")


def _bad_id_message(field: str, where: str, tid: Any, vocab: Vocab) -> str:
    if not _is_int(tid):
        return (f"{field}{where}: token ids must be integers, got {_type_name(tid)} {_short(tid)}; valid token ids "
                f"are {vocab.describe()}")
    return f"{field}{where}: token id {tid} is out of range; valid token ids are {vocab.describe()}"


def _fast_ok(ids: Sequence[Any], hi: int) -> bool:
    """True when every element is a plain int in [0, hi): C-speed for long prompts (a 32K-token prompt in ~1 ms)."""
    if not ids:
        return True
    try:
        if set(map(type, ids)) != {int}:
            return False
        return min(ids) >= 0 and max(ids) < hi
    except TypeError:
        return False


def check_token_id_list(field: str, ids: Any, vocab: Vocab, *, exempt: Iterable[tuple[int, int]] = ()) -> None:
    """Every element of `ids` (a list or tuple) an int in [0, vocab.size); positions inside an (offset, length)
    range of `exempt` are skipped. Raises naming `field`, the first bad position, the value and the range."""
    if ids is None:
        return
    if not isinstance(ids, (list, tuple)):
        _fail(field, f"{field}: must be a list of token ids, got {_type_name(ids)}", None)
    if _fast_ok(ids, vocab.size):
        return
    skip = sorted((int(o), int(o) + int(n)) for o, n in exempt)
    for i, tid in enumerate(ids):
        if _is_int(tid) and 0 <= tid < vocab.size:
            continue
        if any(lo <= i < hi for lo, hi in skip) and _is_int(tid):
            continue
        _fail(field, _bad_id_message(field, f"[{i}]", tid, vocab), tid if _is_int(tid) else _short(tid))


def placeholder_ranges(mm_placeholders: Mapping[str, Sequence[Any]] | None) -> list[tuple[int, int]]:
    """(offset, length) of every multimodal placeholder range (vLLM's PlaceholderRange has .offset and .length)."""
    out: list[tuple[int, int]] = []
    for ranges in (mm_placeholders or {}).values():
        for r in ranges:
            offset = getattr(r, "offset", None)
            length = getattr(r, "length", None)
            if offset is None and isinstance(r, Mapping):
                offset, length = r.get("offset"), r.get("length")
            if _is_int(offset) and _is_int(length):
                out.append((offset, length))
    return out


# ------------------------------------------------------------------------------------------------- entry points
def check_prompt_token_ids(prompt_token_ids: Any, vocab_size: int, *, prompt_type: str = "decoder",
                           mm_placeholders: Mapping[str, Sequence[Any]] | None = None) -> None:
    """A prompt's token ids (after the renderer / chat template: what the embedding will index).

    prompt_type "encoder" names the field "encoder prompt_token_ids" (encoder-decoder models)."""
    field = "prompt_token_ids" if prompt_type == "decoder" else f"{prompt_type} prompt_token_ids"
    check_token_id_list(field, prompt_token_ids, model_vocab(vocab_size), exempt=placeholder_ranges(mm_placeholders))


def tokenizer_size(tokenizer: Any) -> int | None:
    """len(tokenizer) (ids it can decode, added tokens included), or None without a tokenizer."""
    if tokenizer is None:
        return None
    try:
        return int(len(tokenizer))
    except TypeError:
        max_id = getattr(tokenizer, "max_token_id", None)
        return None if max_id is None else int(max_id) + 1


def check_sampling_params(params: Any, vocab_size: int, tokenizer: Any = None) -> None:
    """The client's SamplingParams fields that end up as indices (or typed values) in the engine core.

    Called before upstream's own SamplingParams.verify(), so these messages are the ones a client sees. Anything
    without these attributes (PoolingParams) passes untouched."""
    if params is None or not hasattr(params, "stop_token_ids"):
        return
    vocab = model_vocab(vocab_size)
    check_token_id_list("stop_token_ids", getattr(params, "stop_token_ids", None), vocab)

    allowed = getattr(params, "allowed_token_ids", None)
    if allowed is not None:
        check_token_id_list("allowed_token_ids", allowed,
                            model_and_tokenizer_vocab(vocab_size, tokenizer_size(tokenizer)))

    bias = getattr(params, "logit_bias", None)
    if bias is not None:
        if not isinstance(bias, Mapping):
            _fail("logit_bias", f"logit_bias: must be a mapping of token id to bias, got {_type_name(bias)}")
        for tid, b in bias.items():
            if not _is_int(tid):
                _fail("logit_bias", f"logit_bias: keys must be integer token ids, got {_type_name(tid)} {_short(tid)}; "
                      f"valid token ids are {vocab.describe()}", _short(tid))
            if not 0 <= tid < vocab.size:
                _fail("logit_bias", f"logit_bias: token id {tid} is out of range; valid token ids are "
                      f"{vocab.describe()}", tid)
            if isinstance(b, bool) or not isinstance(b, (int, float)):
                _fail("logit_bias", f"logit_bias[{tid}]: the bias must be a number, got {_type_name(b)} {_short(b)}",
                      _short(b))

    seed = getattr(params, "seed", None)
    if seed is not None and not (_is_int(seed) and SEED_MIN <= seed < SEED_MAX_EXCLUSIVE):
        what = f"{_type_name(seed)} {_short(seed)}" if not _is_int(seed) else str(seed)
        _fail("seed", f"seed: {what} is not valid; a seed must be an integer in [{SEED_MIN}, {SEED_MAX_EXCLUSIVE})",
              _short(seed))


def check_derived_token_ids(sampling_params: Any, vocab_size: int) -> None:
    """Ids the server derives from a request, checked on the copy that goes to the engine core:
    the tokens of `bad_words` (encoded by the tokenizer), and with min_tokens > 0 every stop id it masks (the
    client's stop_token_ids, already checked, plus eos ids from the tokenizer and the generation config)."""
    if sampling_params is None or not hasattr(sampling_params, "stop_token_ids"):
        return
    vocab = model_vocab(vocab_size)
    bad_words_ids = getattr(sampling_params, "bad_words_token_ids", None)
    if bad_words_ids:
        words = list(getattr(sampling_params, "bad_words", None) or [])
        for seq in bad_words_ids:
            for tid in seq:
                if not (_is_int(tid) and 0 <= tid < vocab.size):
                    # one bad word gives one or two token sequences (with and without a leading space)
                    _fail("bad_words", f"bad_words: {_short(words) if words else 'a bad word'} encodes to token id "
                          f"{tid}, which is out of range; valid token ids are {vocab.describe()}", tid)
    min_tokens = getattr(sampling_params, "min_tokens", 0) or 0
    if _is_int(min_tokens) and min_tokens > 0:
        stop_ids = getattr(sampling_params, "all_stop_token_ids", None) or ()
        for tid in sorted(stop_ids, key=lambda t: (not _is_int(t), t if _is_int(t) else 0, repr(t))):
            if not (_is_int(tid) and 0 <= tid < vocab.size):
                _fail("min_tokens", f"min_tokens: stop/eos token id {_short(tid)} (from the model's tokenizer or "
                      f"generation config) is out of range, so min_tokens cannot mask it; valid token ids are "
                      f"{vocab.describe()}; send min_tokens 0 or fix the model's configuration", _short(tid))

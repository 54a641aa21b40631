"""SmolLM2-135M-Instruct's GGUF -> a bf16 Hugging Face directory that transformers and vLLM load as LlamaForCausalLM.

    python -m bench.real_model convert OUT_DIR [--gguf FILE] [--keep-permutation]

* Tensors: ``gguf``'s reader and ``gguf.quants.dequantize`` (Q4_1 / Q8_0 blocks -> float32), renamed to the HF
  Llama names; the output head is the tied embedding (the GGUF has no ``output.weight``).
* llama.cpp's converter reorders the rows of ``attn_q`` / ``attn_k`` so each head's rotary pairs are adjacent (its
  rope rotates (x0, x1), (x2, x3), ...; HF's rotates (x_i, x_{i + d/2})). ``unpermute_rows`` puts HF's order back:
  within each head, row 2j + t of the GGUF is row j + t * d/2 of HF. ``--keep-permutation`` skips that (the
  verification shows the model breaks).
* Tokenizer: a byte-level BPE from the GGUF's vocabulary and merges (tokenizers' ``BPE``), the "smollm" pre-tokenizer
  (digits one by one, then GPT-2's byte-level split), control tokens as special tokens, the chat template and
  bos / eos from the metadata.

The directory is written beside OUT_DIR and renamed into place when complete.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

HF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
TOKEN_TYPE_CONTROL = 3


class ConvertError(Exception):
    pass


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ConvertError(f"GGUF lacks metadata {key}")
        return default
    return f.contents()


def read_config(reader) -> dict:
    """The Llama hyper-parameters of a GGUF (llama.* metadata)."""
    if _field(reader, "general.architecture") != "llama":
        raise ConvertError(f"GGUF architecture is {_field(reader, 'general.architecture')!r}, expected 'llama'")
    hidden, heads = int(_field(reader, "llama.embedding_length")), int(_field(reader, "llama.attention.head_count"))
    return dict(
        hidden_size=hidden, intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")), num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv")), head_dim=hidden // heads,
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        vocab_size=int(_field(reader, "llama.vocab_size")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """GGUF q/k rows (rotary pairs adjacent per head) -> HF's order (pairs d/2 apart)."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def permute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of ``unpermute_rows`` (what llama.cpp's converter did)."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_tensors(reader, cfg: dict, fix_permutation: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32 under its HF name (q/k rows in HF's order unless told not to)."""
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        w = w.reshape([int(n) for n in reversed(t.shape.tolist())]) if w.dim() > 1 or len(t.shape) > 1 else w
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in HF_LAYER_NAMES:
            name = f"model.layers.{parts[1]}.{HF_LAYER_NAMES[parts[2]]}.weight"
            if fix_permutation and parts[2] == "attn_q":
                w = unpermute_rows(w, cfg["num_attention_heads"])
            elif fix_permutation and parts[2] == "attn_k":
                w = unpermute_rows(w, cfg["num_key_value_heads"])
        else:
            raise ConvertError(f"unexpected GGUF tensor {t.name}")
        out[name] = w
    want = 2 + 9 * cfg["num_hidden_layers"]
    if len(out) < want:
        raise ConvertError(f"GGUF holds {len(out)} tensors, a {cfg['num_hidden_layers']}-layer Llama needs {want}")
    return out


def load_gguf(path: Path, fix_permutation: bool = True) -> tuple[dict, dict[str, torch.Tensor], object]:
    """(config, float32 tensors by HF name, the GGUFReader) of a GGUF file."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise ConvertError(f"cannot read GGUF {path}: {exc}") from None
    cfg = read_config(reader)
    return cfg, read_tensors(reader, cfg, fix_permutation), reader


def build_tokenizer(reader):
    """A tokenizers.Tokenizer from the GGUF's gpt2-style vocabulary and merges."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ConvertError("only GGUFs with a gpt2 (byte-level BPE) tokenizer are supported")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                               byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL])
    return tok, tokens


def hf_config(cfg: dict) -> dict:
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", attention_bias=False,
                mlp_bias=False, tie_word_embeddings=True, torch_dtype="bfloat16", rope_scaling=None,
                initializer_range=0.02, pretraining_tp=1, use_cache=True, attention_dropout=0.0, **cfg)


def convert(gguf_file: Path, out_dir: Path, fix_permutation: bool = True) -> Path:
    """Write the HF directory (config, bf16 safetensors, tokenizer files); returns out_dir."""
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    cfg, tensors, reader = load_gguf(gguf_file, fix_permutation)
    tok, tokens = build_tokenizer(reader)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    tmp.chmod(0o755)
    try:
        bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items() if k != "lm_head.weight"}
        save_file(bf16, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg), indent=1) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(
            dict(bos_token_id=cfg["bos_token_id"], eos_token_id=cfg["eos_token_id"])) + "\n")
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=tokens[cfg["bos_token_id"]], eos_token=tokens[cfg["eos_token_id"]],
            unk_token=tokens[int(_field(reader, "tokenizer.ggml.unknown_token_id", 0))],
            pad_token=tokens[int(_field(reader, "tokenizer.ggml.padding_token_id", cfg["eos_token_id"]))],
            model_max_length=cfg["max_position_embeddings"], clean_up_tokenization_spaces=False)
        fast.chat_template = _field(reader, "tokenizer.chat_template")
        fast.save_pretrained(str(tmp))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir

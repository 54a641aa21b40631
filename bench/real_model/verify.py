"""Check the converter: the converted directory under transformers against our own forward on the GGUF as stored.

    python -m bench.real_model verify [--tokens 512] [--hf-dir DIR]

Three perplexities on the same Austen sample (bf16-rounded weights, float32 activations and K/V):
* ``gguf_native``: ``forward.Model`` on the GGUF's tensors as stored (q/k rows in llama.cpp's order) with llama.cpp's
  interleaved rotary layout: no permutation logic involved;
* ``converted``: transformers' ``LlamaForCausalLM`` loading the converted directory from disk (HF's rotary layout);
* ``permutation_skipped``: the same with the q/k rows left in the GGUF's order.
Passes when ``converted`` is within ``MATCH_REL`` of ``gguf_native`` and ``permutation_skipped`` is not.
"""
from __future__ import annotations

import math

import torch

from . import convert, forward

# float32 on both sides, the same bf16-rounded weights: only the order of float32 operations differs
MATCH_REL = 1e-4
# a model with scrambled rotary pairs is far off; 10% is a floor well above any float noise
BROKEN_REL = 0.10


def perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Perplexity of ids[1:] under logits[:-1]."""
    nll = -torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)
    return math.exp(nll.mean().item())


def hf_model(cfg: dict, tensors: dict | None = None, hf_dir=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    if hf_dir is not None:
        return LlamaForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32,
                                                attn_implementation="sdpa").eval()
    model = LlamaForCausalLM(LlamaConfig(**convert.hf_config(cfg))).eval()
    state = {k: v for k, v in forward.bf16_weights(tensors).items() if k != "lm_head.weight"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise convert.ConvertError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model


@torch.no_grad()
def hf_perplexity(model, ids: torch.Tensor) -> float:
    return perplexity(model(ids[None]).logits[0], ids)


def run(gguf_file, hf_dir, ids: torch.Tensor) -> dict:
    cfg, raw, _ = convert.load_gguf(gguf_file, fix_permutation=False)
    native = forward.Model(cfg, forward.bf16_weights(raw), rope="interleaved")
    ppl_native = perplexity(native.forward(ids, native.new_caches("float32")), ids)
    ppl_conv = hf_perplexity(hf_model(cfg, hf_dir=hf_dir), ids)
    ppl_skip = hf_perplexity(hf_model(cfg, raw), ids)
    rel = abs(ppl_conv / ppl_native - 1)
    rel_skip = abs(ppl_skip / ppl_native - 1)
    return dict(tokens=int(ids.numel()), gguf_native=ppl_native, converted=ppl_conv, permutation_skipped=ppl_skip,
                converted_rel=rel, skipped_rel=rel_skip, match_limit=MATCH_REL, broken_floor=BROKEN_REL,
                passed=rel <= MATCH_REL and rel_skip >= BROKEN_REL)

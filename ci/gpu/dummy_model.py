#!/usr/bin/env python3
"""Write a Qwen3.5-27B-shaped model folder (config.json only) for load_format="dummy".

    python ci/gpu/dummy_model.py --layers {4,16,64} --out DIR

Every per-layer shape is the real model's: hidden 5120, MLP 17408, vocabulary 248320; full attention on
every 4th layer (24 query / 4 KV heads x 256, partial rotary 0.25, output gate); Gated DeltaNet on the rest
(16 key / 48 value heads x 128, conv kernel 4). Fewer layers only shorten the stack: 16 layers keep 4
full-attention layers and start about four times faster than 64. Weights are random (vLLM's dummy loader)
and there is no tokenizer: drive it with prompt_token_ids (or add a tokenizer to the folder yourself).
Drivers import write_config(out_dir, layers).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FULL_ATTENTION_INTERVAL = 4
VOCAB_SIZE = 248320
EOS_TOKEN_ID = 248044


def text_config(layers: int) -> dict:
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": layers,
        "layer_types": ["full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
                        for i in range(layers)],
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "partial_rotary_factor": 0.25,
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
        "tie_word_embeddings": False,
        "eos_token_id": EOS_TOKEN_ID,
    }


def model_config(layers: int) -> dict:
    if not isinstance(layers, int) or layers < FULL_ATTENTION_INTERVAL or layers % FULL_ATTENTION_INTERVAL:
        raise ValueError(f"layers must be a positive multiple of {FULL_ATTENTION_INTERVAL} (4, 16, 64, ...), "
                         f"got {layers!r}")
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config(layers),
        # language_model_only=True never builds the vision tower; a small one keeps the config valid
        "vision_config": {"depth": 2, "hidden_size": 256, "intermediate_size": 512, "num_heads": 4,
                          "out_hidden_size": 5120},
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def write_config(out_dir, layers: int) -> Path:
    """Write out_dir/config.json for a `layers`-layer Qwen3.5-27B-shaped model; return the folder."""
    cfg = model_config(layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, required=True, help="4, 16 or 64 (any multiple of 4)")
    ap.add_argument("--out", required=True, help="model folder to write config.json into")
    args = ap.parse_args(argv)
    try:
        out = write_config(args.out, args.layers)
    except (ValueError, OSError) as e:
        print(f"dummy_model.py: error: {e}", file=sys.stderr)
        return 2
    print(f"dummy_model: {out / 'config.json'} ({args.layers} layers, "
          f"{args.layers // FULL_ATTENTION_INTERVAL} full attention)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

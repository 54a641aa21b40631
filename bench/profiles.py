"""Memory profiles for the serving benchmark.

`h200`: the whole card, as the contest script asks for it:
`--gpu-memory-utilization 0.95`. With dummy weights at 16 layers this leaves
far more KV cache than a DCU has, so KV capacity never binds.

`dcu64`: the KV cache a 64 GB DCU (BW1000 class) leaves for Qwen3.5-27B bf16
under the contest's flags, scaled to the layers we load, and enforced with
`--kv-cache-memory-bytes` (vLLM 0.18.1 has it: CacheConfig.kv_cache_memory_bytes;
when set, the worker still runs the profile pass but reserves exactly that
many bytes and ignores --gpu-memory-utilization).

The arithmetic (all GiB = 2**30 bytes; every constant is below and in the JSON):
  card memory                       64 GiB (4 HBM stacks x 16 GiB; the runtime reports a little less)
  x gpu_memory_utilization 0.95   = 60.80 GiB that vLLM may use
  - language-model weights         50.10 GiB  (26.90e9 params x 2 B, counted from the config below:
                                               embed + lm_head 2.54e9, MLP 64 x 267.4e6,
                                               16 full-attention layers x 104.9e6 (q with output gate,
                                               k, v, o), 48 Gated DeltaNet layers x 115.9e6)
  - vision tower                     0.86 GiB  (~0.46e9 params; the official script does not pass
                                               --language-model-only, so the DCU loads it; our runs do
                                               pass it, so it is subtracted here)
  - activation peak of the profile   2.00 GiB  (4096-token chunk: MLP gate_up 285 MB, GDN chunk states
                                               ~200 MB, sampler over 128 seqs x 248320 vocab in fp32
                                               ~0.5 GB with copies, encoder profile; an estimate to be
                                               replaced by the DCU log's "torch peak memory increase")
  - non-torch memory                 0.75 GiB  (HIP context, rocBLAS/hipBLASLt workspaces; estimate)
  = KV cache for 64 layers           7.10 GiB
  scaled to L layers: 7.10 x L / 64 GiB (16 layers: 1.77 GiB).
Scaling by L/64 keeps the number of KV pages the same as on the DCU, because
the bytes of one hybrid page (784 tokens of full-attention KV, or one Gated
DeltaNet state, per layer group) scale with L the same way. At bf16 that is
about 148 pages (16 layer groups x 3.2 MB each): three 32K requests (42 attention pages + 3
DeltaNet state pages each), or six 16K requests, at once.
The result is very sensitive to the card size: if "64 GB" were 64e9 bytes the
budget would drop to ~2.9 GiB. Override with --kv-gib when the DCU's log gives
the real number ("Available KV cache memory: X GiB").
"""
from __future__ import annotations

GIB = 1 << 30

# Qwen3.5-27B language model shapes.
HIDDEN = 5120
INTERMEDIATE = 17408
VOCAB = 248320
LAYERS_FULL_MODEL = 64
FULL_ATTENTION_INTERVAL = 4
Q_HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256
GDN_K_HEADS, GDN_V_HEADS, GDN_HEAD_DIM, GDN_CONV = 16, 48, 128, 4

DCU_CARD_GIB = 64.0
DCU_UTILIZATION = 0.95
VISION_PARAMS = 0.46e9
ACTIVATION_PEAK_GIB = 2.0
NON_TORCH_GIB = 0.75

PROFILES = ("h200", "dcu64")


def lm_params(layers: int = LAYERS_FULL_MODEL) -> int:
    """Language-model parameter count of Qwen3.5-27B truncated to `layers` layers."""
    check_layers(layers)
    embed_and_head = 2 * VOCAB * HIDDEN + HIDDEN
    mlp = 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN  # gate, up, down + the two RMSNorms
    attn = (HIDDEN * Q_HEADS * HEAD_DIM * 2  # q_proj with the output gate
            + 2 * HIDDEN * KV_HEADS * HEAD_DIM  # k_proj, v_proj
            + Q_HEADS * HEAD_DIM * HIDDEN  # o_proj
            + 2 * HEAD_DIM)  # q_norm, k_norm
    key_dim, value_dim = GDN_K_HEADS * GDN_HEAD_DIM, GDN_V_HEADS * GDN_HEAD_DIM
    gdn = (HIDDEN * (2 * key_dim + 2 * value_dim)  # in_proj_qkvz
           + HIDDEN * 2 * GDN_V_HEADS  # in_proj_ba
           + (2 * key_dim + value_dim) * GDN_CONV  # conv1d
           + 2 * GDN_V_HEADS + GDN_HEAD_DIM  # dt_bias, A_log, gated norm
           + value_dim * HIDDEN)  # out_proj
    n_full = layers // FULL_ATTENTION_INTERVAL
    return embed_and_head + layers * mlp + n_full * attn + (layers - n_full) * gdn


def dcu64_breakdown() -> dict[str, float]:
    """The terms of the dcu64 budget in GiB (see the module docstring)."""
    usable = DCU_CARD_GIB * DCU_UTILIZATION
    weights = lm_params(LAYERS_FULL_MODEL) * 2 / GIB
    vision = VISION_PARAMS * 2 / GIB
    kv = usable - weights - vision - ACTIVATION_PEAK_GIB - NON_TORCH_GIB
    return {
        "card_gib": DCU_CARD_GIB,
        "utilization": DCU_UTILIZATION,
        "usable_gib": usable,
        "lm_weights_gib": weights,
        "vision_weights_gib": vision,
        "activation_peak_gib": ACTIVATION_PEAK_GIB,
        "non_torch_gib": NON_TORCH_GIB,
        "kv_gib_64_layers": kv,
    }


def check_layers(layers: int) -> int:
    if layers < FULL_ATTENTION_INTERVAL or layers > LAYERS_FULL_MODEL or layers % FULL_ATTENTION_INTERVAL:
        raise ValueError(f"--layers must be a multiple of {FULL_ATTENTION_INTERVAL} in "
                         f"[{FULL_ATTENTION_INTERVAL}, {LAYERS_FULL_MODEL}], got {layers}")
    return layers


def dcu64_kv_bytes(layers: int, kv_gib_64_layers: float | None = None) -> int:
    """KV-cache bytes for the dcu64 profile at `layers` layers."""
    check_layers(layers)
    kv64 = dcu64_breakdown()["kv_gib_64_layers"] if kv_gib_64_layers is None else kv_gib_64_layers
    if kv64 <= 0:
        raise ValueError(f"dcu64 KV budget is {kv64:.2f} GiB; nothing left for the KV cache")
    return int(kv64 * GIB * layers / LAYERS_FULL_MODEL)


def profile_server_args(profile: str, layers: int, kv_gib_64_layers: float | None = None) -> list[str]:
    """Server flags that set the memory profile."""
    if profile == "h200":
        return ["--gpu-memory-utilization", "0.95"]
    if profile == "dcu64":
        return ["--gpu-memory-utilization", "0.95",
                "--kv-cache-memory-bytes", str(dcu64_kv_bytes(layers, kv_gib_64_layers))]
    raise ValueError(f"unknown memory profile {profile!r}; supported: {', '.join(PROFILES)}")

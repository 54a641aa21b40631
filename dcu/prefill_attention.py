"""Route unified attention's launches with prefill to vllm.dcu_kernels.prefill_attention, and warm it at start.

Patch 0006's hooks call the three public names here:

* ``route_unified_attention(upstream)`` wraps ``triton_unified_attention.unified_attention``: a launch with prefill
  (``max_seqlen_q > 1``: prefill chunks and mixed batches, decode rows included) whose features the kernel covers
  goes to the prefill kernel; everything else (decode-only launches, ALiBi, sliding window, soft cap, sinks,
  fused output quantization, per-tensor fp8 caches, head sizes over 256, batch-invariant mode) goes to upstream
  unchanged. ``VLLM_DCU_PREFILL_ATTN=0`` sends everything to upstream.
* ``warmup(...)`` runs the kernel once on a small batch with the engine's cache layout when the attention
  metadata builder is made (after vLLM's memory profile, before CUDA graphs are captured), so the one Triton
  specialization a request can meet is compiled before the engine serves: the kernel specializes on nothing
  that changes between requests (chunk lengths, history lengths, batch size are runtime values).
* ``reserve_mirror(...)``, called when each attention layer's impl is made (while vLLM builds the model, before its
  memory profile): with an 8-bit cache it sizes the kernel's 16-bit mirror from the engine's max_model_len
  (``engine_mirror_tokens``) and allocates it, so vLLM counts it with the model's memory and sizes the KV cache
  around it; a sequence of any allowed length takes the mirror (a longer one would read the 8-bit cache directly,
  ~2.4x the mirror's attention time), and a mirror that does not fit fails at startup, not at the first long
  request.

No vLLM import at module level: the routing rules are tested without a vLLM tree.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time

import torch

from . import _kernels as _kernels_mod
from . import kernel_checks

ENV_VAR = "VLLM_DCU_PREFILL_ATTN"
MAX_HEAD_SIZE = 256
_DTYPES = (torch.float16, torch.bfloat16)

log = logging.getLogger("vllm.dcu.prefill_attention")


def enabled(env=None) -> bool:
    """``VLLM_DCU_PREFILL_ATTN``: unset or 1 = on, 0 = off; anything else fails naming the allowed values."""
    raw = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV_VAR}={raw!r}: supported values are 1 (default) and 0")
    return raw != "0"


def _kernels():
    """(prefill_attention, MAX_GROUP, the kv_quant layout module), as _kernels.py resolves them (imported on first
    use; the tests replace this function)."""
    from ._kernels import MAX_GROUP, layout, prefill_attention

    return prefill_attention, MAX_GROUP, layout


def _runs_ours(kv_quant) -> bool:
    """The device's decision for this launch kind (issue #43: taken at start by ``warmup``'s check); a dict lookup
    per launch."""
    return _kernels_mod.runs_ours(_PATHS[kv_quant])


_PATHS = {None: "prefill.bf16", "int8": "prefill.int8", "fp8": "prefill.fp8"}


def _mirror_api():
    """The module of the prefill kernel _kernels() returns: its mirror constants, env reader and buffer."""
    return sys.modules[_kernels()[0].__module__]


def engine_mirror_tokens(max_model_len: int | None, env=None) -> int:
    """Tokens of the 16-bit mirror of 8-bit caches for an engine of this max_model_len:
    ``VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS`` when set (0 = off), else one sequence of max_model_len rounded up to the
    mirror's page (256 tokens), never below the kernel's default (32768 tokens: several shorter prompts in one
    batch still fit). 4 MiB per 1024 tokens at Qwen3.5-27B's 4 kv heads x 256."""
    mod = _mirror_api()
    raw = (os.environ if env is None else env).get(mod.MIRROR_ENV, "").strip()
    if raw or not max_model_len:
        return mod.mirror_tokens(env)
    page = mod.MIRROR_PAGE
    return max(mod.MIRROR_DEFAULT_TOKENS, -(-int(max_model_len) // page) * page)


def mirror_bytes(tokens: int, num_heads_kv: int, head_size: int) -> int:
    """Device bytes of a mirror of ``tokens`` tokens: 16-bit K and V plus K's float32 scales per (token, kv head)."""
    return tokens * num_heads_kv * (2 * 2 * head_size + 4)


_ENGINE_MIRROR: dict = {}  # "tokens": the size chosen for this process's engine (absent: the kernel's default)


def _current_vllm_config():
    """vLLM's current config, or None outside its context (0.18.1 has get_current_vllm_config_or_none; a fork
    without it raises from get_current_vllm_config there)."""
    try:
        import vllm.config as config
    except ImportError:  # the kernel alone, without vLLM (GPU kernel tests)
        return None
    if hasattr(config, "get_current_vllm_config_or_none"):
        return config.get_current_vllm_config_or_none()
    try:
        return config.get_current_vllm_config()
    except AssertionError:
        return None


def _covered(num_heads_q: int, num_heads_kv: int, head_size: int, max_group: int) -> bool:
    return head_size <= MAX_HEAD_SIZE and num_heads_q % num_heads_kv == 0 and num_heads_q // num_heads_kv <= max_group


def reserve_mirror(num_heads_q: int, num_heads_kv: int, head_size: int, cache_dtype: str,
                   max_model_len: int | None = None, device=None) -> int | None:
    """Allocate the 16-bit mirror of an 8-bit cache for this engine now; its size in tokens, or None when the
    prefill kernel will not need one (kernel off, not an 8-bit per-token-head cache, a shape it does not cover, no
    GPU). Patch 0006 calls it from TritonAttentionImpl.__init__, i.e. while vLLM builds the model: allocated there,
    the mirror counts as model memory in vLLM's memory profile, and the KV cache is sized around it.
    max_model_len: None reads it from vLLM's current config (none set: the kernel's default size). The buffer is
    allocated once per process and shape; later calls (every attention layer makes an impl) return the same size.
    device: the current CUDA device when None."""
    if not enabled() or not torch.cuda.is_available():
        return None
    _, max_group, layout = _kernels()
    if layout.kv_quant_kind(cache_dtype) is None or not _covered(num_heads_q, num_heads_kv, head_size, max_group):
        return None
    if max_model_len is None:  # vLLM's (outside its config context, an impl made by hand: the kernel's default)
        max_model_len = getattr(getattr(_current_vllm_config(), "model_config", None), "max_model_len", None)
    tokens = engine_mirror_tokens(max_model_len)
    mod = _mirror_api()
    if tokens >= mod.MIRROR_PAGE:
        device = torch.device("cuda") if device is None else torch.device(device)
        if device.index is None:  # the kernel keys its buffer by "cuda:N", as q.device names it
            device = torch.device("cuda", torch.cuda.current_device())
        try:
            mod.mirror_buffer(device, num_heads_kv, head_size, tokens)
        except torch.OutOfMemoryError as e:
            mib = mirror_bytes(tokens, num_heads_kv, head_size) / 2**20
            raise RuntimeError(
                f"vllm-dcu: the 8-bit KV cache's prefill mirror ({tokens} tokens, {mib:.0f} MiB, sized from "
                f"max_model_len {max_model_len}) does not fit in GPU memory: lower --gpu-memory-utilization or "
                f"--max-model-len, or set {mod.MIRROR_ENV} to fewer tokens (0: no mirror; sequences longer than the "
                "mirror read the 8-bit cache directly, ~2.4x the attention time)") from e
    if _ENGINE_MIRROR.get("tokens") != tokens:
        _ENGINE_MIRROR["tokens"] = tokens
        env = mod.MIRROR_ENV
        if tokens == 0:
            log.info("vllm-dcu: 8-bit prefill mirror off (%s=0): prefill reads the 8-bit cache directly", env)
        else:
            source = f"from {env}" if os.environ.get(env, "").strip() else f"for max_model_len {max_model_len}"
            log.info("vllm-dcu: 8-bit prefill mirror of %d tokens (%.0f MiB, counted with the model's memory), %s",
                     tokens, mirror_bytes(tokens, num_heads_kv, head_size) / 2**20, source)
    return tokens


def unsupported(kw: dict) -> str | None:
    """Why the prefill kernel cannot take this ``unified_attention`` call (its keyword arguments), or None."""
    q, k = kw["q"], kw["k"]
    _, max_group, _ = _kernels()
    if not kw.get("causal", True):
        return "non-causal"
    if kw.get("alibi_slopes") is not None:
        return "ALiBi"
    if kw.get("sinks") is not None:
        return "sinks"
    if kw.get("softcap"):
        return "soft cap"
    window = kw.get("window_size")
    if window is not None and tuple(window) != (-1, -1):
        return "sliding window"
    if kw.get("output_scale") is not None:
        return "fused output quantization"
    if kw.get("qq_bias") is not None:
        return "qq_bias"
    if kw.get("mm_prefix_range") is not None:
        return "multimodal prefix ranges"
    if kw.get("q_descale") is not None:
        return "fp8 queries"
    if q.dtype not in _DTYPES:
        return f"query dtype {q.dtype}"
    kv_quant = kw.get("kv_quant")
    if kv_quant is not None:
        if kv_quant not in ("fp8", "int8") or kw.get("k_scale_cache") is None:
            return f"kv_quant {kv_quant!r}"
    elif k.dtype != q.dtype:
        return f"cache dtype {k.dtype} (per-tensor fp8)"
    if q.shape[-1] > MAX_HEAD_SIZE:
        return f"head size {q.shape[-1]} > {MAX_HEAD_SIZE}"
    hkv = k.shape[2]
    if q.shape[1] % hkv or q.shape[1] // hkv > max_group:
        return f"{q.shape[1]} q heads over {hkv} kv heads"
    return None


def _batch_invariant() -> bool:
    try:
        from vllm.model_executor.layers.batch_invariant import vllm_is_batch_invariant
    except ImportError:
        return False
    return bool(vllm_is_batch_invariant())


def route_unified_attention(upstream):
    """``upstream`` (0.18.1's unified_attention) with launches that carry prefill sent to the prefill kernel."""
    on = enabled()  # read once, at import of the patched module: a bad value fails at startup

    @functools.wraps(upstream)
    def unified_attention(**kw):
        if not on or kw["max_seqlen_q"] <= 1 or unsupported(kw) is not None or _batch_invariant() \
                or not _runs_ours(kw.get("kv_quant")):
            return upstream(**kw)
        prefill_attention, _, _ = _kernels()
        kv_quant = kw.get("kv_quant")
        return prefill_attention(
            kw["q"], kw["k"], kw["v"], kw["out"], kw["cu_seqlens_q"], kw["seqused_k"], kw["block_table"],
            kw["softmax_scale"], k_scales=kw.get("k_scale_cache") if kv_quant else None,
            v_scales=kw.get("v_scale_cache") if kv_quant else None, kv_quant=kv_quant,
            software_fp8=kw.get("software_fp8"), max_seqlen_k=kw.get("max_seqlen_k"),
            mirror=_ENGINE_MIRROR.get("tokens"),
        )

    unified_attention.dcu_upstream = upstream
    return unified_attention


_WARM: set = set()


def warmup(num_heads_q: int, num_heads_kv: int, head_size: int, dtype: torch.dtype, cache_dtype: str,
           block_size: int, device, max_model_len: int | None = None) -> float | None:
    """Compile the prefill kernel for this engine's attention shape and cache layout now; the seconds it took,
    or None when there is nothing to warm (kernel off, unsupported shape, not a GPU). Runs a batch of a
    prefill chunk with history (both stages) and a decode row, on a cache laid out like vLLM's. With an 8-bit
    cache it uses the mirror reserve_mirror allocated while the model was built, or reserves it now (outside an
    engine)."""
    device = torch.device(device)
    if not enabled() or device.type != "cuda" or dtype not in _DTYPES or head_size > MAX_HEAD_SIZE:
        return None
    _, max_group, layout = _kernels()
    kv_quant = layout.kv_quant_kind(cache_dtype)
    if kv_quant is None and cache_dtype not in ("auto", "bfloat16", "float16"):
        return None
    if not _covered(num_heads_q, num_heads_kv, head_size, max_group):
        return None
    mirror = None
    if kv_quant is not None:
        mirror = _ENGINE_MIRROR.get("tokens")
        if mirror is None:  # no model build reserved it (warmup outside an engine)
            mirror = reserve_mirror(num_heads_q, num_heads_kv, head_size, cache_dtype, max_model_len, device=device)
    key = (num_heads_q, num_heads_kv, head_size, dtype, kv_quant, block_size, device, mirror)
    if key in _WARM:
        return 0.0
    t0 = time.perf_counter()
    # the device decides (issue #43): compiled and compared here, before the engine serves; a failure hands this
    # launch kind to upstream's unified attention with one warning line
    ours = kernel_checks.check_prefill(num_heads_q, num_heads_kv, head_size, dtype, kv_quant, block_size, device,
                                       mirror)
    kernel_checks.check_kv_write(num_heads_kv, head_size, dtype, cache_dtype, block_size, device)
    torch.cuda.synchronize(device)
    _WARM.add(key)
    seconds = time.perf_counter() - t0
    if ours:
        log.info("vllm-dcu: prefill attention kernel ready (%s KV, block %d, %d/%d heads x %d) in %.1f s",
                 kv_quant or str(dtype).replace("torch.", ""), block_size, num_heads_q, num_heads_kv, head_size,
                 seconds)
    return seconds

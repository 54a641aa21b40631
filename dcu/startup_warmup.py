"""Compile and autotune at engine start what a model's first request would otherwise compile (patch 0009).

vLLM 0.18.1 serving Qwen3.5 (and Qwen3-Next) compiles nine Triton kernels at the first request, in every build
(seen in bench/e2e_offline --compile-log): the six Gated DeltaNet chunk kernels, causal_conv1d's prefill kernel,
the GDN gating kernel and the KV block zeroing kernel. On a fresh machine the chunk kernels also run their
autotuning sweeps there: about 45 s on a BW1000 (../shared/reference/peer-contest-repo.md), after the KV cache
has taken the memory that the sweeps' benchmark buffers need. Causes in 0.18.1:
- the profile run's warm-up (Qwen3NextGatedDeltaNet._warmup_prefill_kernels) calls the chunked delta rule with
  g and beta in the model's dtype and int64 cu_seqlens, without a final state; a prefill passes g in float32
  (fused_gdn_gating's output), int32 cu_seqlens (the runner's query_start_loc) and asks for the final state. The
  autotuner's key holds every tensor argument's dtype and the kernels specialize on the final-state flag, so
  nothing it tuned or compiled is used by a request;
- causal_conv1d's prefill kernel takes the number of cache lines and the state's strides as constexprs, which
  exist only once the KV cache does; the gating kernel and the block zeroing kernel run in no warm-up at all.

Two hooks, both from patch 0009:
- ``warm_gdn_prefill(layer, mixed_qkv, b, a)``, in vLLM's profile run (no attention metadata, before the KV
  cache is sized): the gating kernel and the chunked delta rule called the way a prefill chunk calls them, first
  at the profile run's token count (the chunk size the scheduler cuts prefills into, so the autotuner's pick is
  timed at a real chunk's size and the profile's peak memory includes the chunk kernels' working set), then at
  32 and 16 tokens (chunk_fwd_kernel_o's other two BT values). Once per process and layer shape.
- ``warm_first_request(runner)``, after the KV cache is allocated and before CUDA graphs are captured: two dummy
  batches of decode rows plus one prefill through the whole model with attention metadata (the batch's token
  count once a multiple of 16 and once not: Triton specializes integer arguments on that), then the block zeroing
  kernel for 1, 2 and 16 blocks (specializations 1, other, multiple of 16) of the null block, which no request
  ever holds. The autotuning keys are the profile run's by then, so this only compiles.

``VLLM_DCU_STARTUP_WARMUP=0`` turns both off (upstream's own profile-run warm-up runs instead of the first).
No vLLM import at module level: the logic is tested without a vLLM tree.
"""
from __future__ import annotations

import logging
import os
import time

import torch

log = logging.getLogger("vllm.dcu.startup_warmup")

ENV_VAR = "VLLM_DCU_STARTUP_WARMUP"
# chunk_fwd_kernel_o's BT is min(64, max(16, next_power_of_2(T))): 64 for any chunk over 32 tokens, else 32 or 16
GDN_SHORT_LENGTHS = (32, 16)
GDN_MIN_FULL_CHUNK = 64
# dummy batches after the KV cache exists: one token count a multiple of 16, one not
FIRST_REQUEST_TOKENS = (64, 67)
# KV block zeroing kernel: n_blocks == 1, not a multiple of 16, a multiple of 16
ZERO_BLOCK_COUNTS = (1, 2, 16)
NULL_BLOCK_ID = 0
# attention backends whose metadata builders take the runner's dummy prefill batches (vLLM 0.18.1's FlashInfer
# warm-up notes that some hybrid backends do not); with any other, warm_first_request does nothing and says so
SUPPORTED_BACKENDS = ("DCU_TRITON_ATTN", "TRITON_ATTN", "GDN_ATTN")

_WARM_GDN: set = set()


def enabled(env=None) -> bool:
    """``VLLM_DCU_STARTUP_WARMUP``: unset or 1 = on, 0 = off; anything else fails naming the allowed values."""
    raw = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV_VAR}={raw!r}: supported values are 1 (default) and 0")
    return raw != "0"


def gdn_lengths(num_tokens: int) -> list[int]:
    """Token counts of the profile-run GDN passes, in order: the profile run's own count first (at least 64, so
    the BT-64 kernels are tuned at a full chunk's size or more), then the short ones."""
    return [max(int(num_tokens), GDN_MIN_FULL_CHUNK), *GDN_SHORT_LENGTHS]


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first n rows of t (the profile run's own tensor), or a new tensor of n rows like it when t is shorter."""
    if t.shape[0] >= n:
        return t[:n]
    return torch.randn((n, *t.shape[1:]), device=t.device).to(t.dtype)


def _gdn_prefill_pass(layer, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, gating) -> None:
    """One prefill of len(mixed_qkv) tokens through the layer's gating and chunked delta rule, with the argument
    dtypes and flags of Qwen3NextGatedDeltaNet._forward_core's prefill branch (vLLM 0.18.1)."""
    num_tokens = mixed_qkv.shape[0]
    g, beta = gating(layer.A_log, a, b, layer.dt_bias)  # g float32, beta in b's dtype
    q, k, v = layer.rearrange_mixed_qkv(mixed_qkv)  # contiguous, as after the convolution
    _, state_dtype = layer.get_state_dtype()
    _, ssm_shape = layer.get_state_shape()
    initial_state = torch.zeros((1, *ssm_shape), dtype=state_dtype, device=mixed_qkv.device)
    cu_seqlens = torch.tensor([0, num_tokens], dtype=torch.int32, device=mixed_qkv.device)  # query_start_loc's
    layer.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                 output_final_state=True, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True)


def warm_gdn_prefill(layer, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, gating=None) -> float | None:
    """Profile-run hook of a Gated DeltaNet layer (module docstring); the seconds it took, or None when this layer
    shape was warmed already in this process. With the warm-up switched off, upstream's own warm-up runs."""
    if not enabled():
        layer._warmup_prefill_kernels(mixed_qkv)
        return None
    key = (tuple(mixed_qkv.shape[1:]), mixed_qkv.dtype, b.dtype, a.dtype, tuple(b.shape[1:]), layer.get_state_dtype(),
           tuple(layer.get_state_shape()[1]), str(mixed_qkv.device))
    if key in _WARM_GDN:
        return None
    if gating is None:
        from vllm.model_executor.models.qwen3_next import fused_gdn_gating as gating
    t0 = time.perf_counter()
    lengths = gdn_lengths(mixed_qkv.shape[0])
    for n in lengths:
        _gdn_prefill_pass(layer, _rows(mixed_qkv, n), _rows(b, n), _rows(a, n), gating)
    if mixed_qkv.is_cuda:
        torch.cuda.synchronize(mixed_qkv.device)
    _WARM_GDN.add(key)
    seconds = time.perf_counter() - t0
    log.info("vllm-dcu: Gated DeltaNet prefill kernels tuned and compiled for %s-token chunks in %.1f s",
             "/".join(map(str, lengths)), seconds)
    return seconds


def _backend_names(runner) -> set[str]:
    names = set()
    for groups in runner.attn_groups:
        for group in groups:
            try:
                names.add(group.backend.get_name())
            except NotImplementedError:
                names.add(getattr(group.backend, "__name__", "unknown"))
    return names


def first_request_tokens(max_tokens: int) -> list[int]:
    """Token counts of the dummy prefill batches: FIRST_REQUEST_TOKENS within the runner's token budget (at least
    2: a decode row and a one-token prefill)."""
    return sorted({max(2, min(n, int(max_tokens))) for n in FIRST_REQUEST_TOKENS})


def warm_first_request(runner) -> float | None:
    """Post-allocation hook (module docstring); the seconds it took, or None when it did nothing (switched off,
    or an attention backend that is not known to build metadata for the runner's dummy prefill batches)."""
    if not enabled():
        return None
    names = _backend_names(runner)
    unsupported = sorted(names - set(SUPPORTED_BACKENDS))
    if unsupported:
        log.info("vllm-dcu: first-request warm-up skipped: attention backends %s (it runs with %s only)",
                 ", ".join(unsupported), ", ".join(SUPPORTED_BACKENDS))
        return None
    t0 = time.perf_counter()
    counts = first_request_tokens(runner.max_num_tokens)  # max_num_batched_tokens; what _dummy_run checks against
    for n in counts:
        runner._dummy_run(n, force_attention=True, create_mixed_batch=True, skip_eplb=True, is_profile=True)
    for n in ZERO_BLOCK_COUNTS:
        runner._zero_block_ids([NULL_BLOCK_ID] * n)
    if torch.device(runner.device).type == "cuda":
        torch.cuda.synchronize(runner.device)
    seconds = time.perf_counter() - t0
    log.info("vllm-dcu: first-request kernels compiled in %.1f s (prefill batches of %s tokens, %s zeroed blocks)",
             seconds, "/".join(map(str, counts)), "/".join(map(str, ZERO_BLOCK_COUNTS)))
    from .kernel_checks import log_decisions

    log_decisions(log.info)  # every launch kind is decided by now (issue #43): one table, once
    return seconds

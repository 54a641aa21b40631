"""DCU_TRITON_ATTN: TRITON_ATTN plus a split-KV (flash-decoding) kernel for decode rows.

Decode-only batches (every request has one query token) go to
``vllm.dcu_kernels.decode_attention``, which spreads one sequence over enough programs to fill the
chip. In a mixed batch the leading requests with one query token (the decode rows: vLLM's runner puts them first
for Qwen3.5's hybrid layers) go to the same kernel, and the rest of the batch to TRITON_ATTN's forward with the
metadata of the rest (``VLLM_DCU_MIXED_DECODE_ROWS=0`` sends the whole mixed batch there, as before): on the
prefill kernel a decode row is one program per kv head that walks the whole history (H200, 32K history: ~1.5 ms per
layer, against ~50 us here), which a chunk with a shorter history than the decode rows' cannot hide. Prefill
batches and the features the decode kernel does not cover (ALiBi, sliding
window, soft cap, sinks, fused output quantization, per-tensor fp8 KV, encoder attention), go to
TRITON_ATTN's unified attention unchanged. The decode kernel reads bf16/fp16 caches and, when the
per-token-head cache dtypes exist, their uint8 codes + float32 scales.

The device decides (issue #43): the metadata builder checks the decode kernel (and the 8-bit cache write) once at
start against their references (vllm.dcu.kernel_checks); a launch kind whose check fails, or that the device's tuned
file or ``VLLM_DCU_DECODE_ATTN=0`` gives to upstream, runs TRITON_ATTN's forward.

Patch 0003-dcu-triton-decode-attention registers ``DcuTritonAttentionBackend`` as ``DCU_TRITON_ATTN`` in vLLM's
backend registry and puts it before TRITON_ATTN in ROCm's priority list; without that patch nothing imports this
module. It subclasses TRITON_ATTN's classes, so it needs vLLM (tests/test_dcu_triton_attn.py runs it against the
patched tree on the CPU).
"""

import os
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import torch

from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)

from . import kernel_checks
from ._kernels import decode_attention, kv_quant_kind, runs_ours, split_kv_cache, workspace_numel

_DECODE_DTYPES = (torch.float16, torch.bfloat16)
_MAX_GQA_GROUP = 16
MIXED_ENV = "VLLM_DCU_MIXED_DECODE_ROWS"


def mixed_decode_rows_enabled(env=None) -> bool:
    """``VLLM_DCU_MIXED_DECODE_ROWS``: unset or 1 = a mixed batch's decode rows take the split-KV kernel, 0 = the
    whole mixed batch goes to TRITON_ATTN's forward; anything else fails naming the allowed values."""
    raw = (os.environ if env is None else env).get(MIXED_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{MIXED_ENV}={raw!r}: supported values are 1 (default) and 0")
    return raw != "0"


def leading_decode_rows(query_start_loc_cpu: torch.Tensor, num_reqs: int) -> int:
    """How many requests at the start of the batch have exactly one query token (host tensor, num_reqs + 1
    entries). A request of one token that follows a longer one stays with the rest of the batch."""
    lens = query_start_loc_cpu[1 : num_reqs + 1] - query_start_loc_cpu[:num_reqs]
    longer = (lens != 1).nonzero()
    return int(longer[0, 0]) if longer.numel() else num_reqs


@dataclass
class DcuTritonAttentionMetadata(TritonAttentionMetadata):
    decode_only: bool = False  # every request has one query token: use the split-KV kernel
    decode_workspace: torch.Tensor | None = None
    # mixed batches: the first num_mixed_decodes requests have one query token each (they take the split-KV kernel
    # with mixed_decode_seq_lens = seq_lens[:num_mixed_decodes], sliced once per step, not per layer); mixed_rest is
    # TRITON_ATTN's metadata of the other requests
    num_mixed_decodes: int = 0
    mixed_decode_seq_lens: torch.Tensor | None = None
    mixed_rest: TritonAttentionMetadata | None = None


class DcuTritonAttentionMetadataBuilder(TritonAttentionMetadataBuilder):
    # Full graphs only for uniform batches: a graph captured for a decode batch contains the
    # decode kernel, so it must never be replayed for a mixed batch (which ALWAYS would allow).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # one workspace for the largest decode batch, preallocated so graphs can capture it
        compilation = vllm_config.compilation_config
        self.max_decode_batch = max(
            vllm_config.scheduler_config.max_num_seqs,
            max(compilation.cudagraph_capture_sizes or [0]),
        )
        kv8 = kv_quant_kind(vllm_config.cache_config.cache_dtype) is not None
        numel = max(
            workspace_numel(b, self.num_heads_q, self.num_heads_kv, self.headdim, device, kv8)
            for b in range(1, self.max_decode_batch + 1)
        )
        self.decode_workspace = torch.empty(numel, dtype=torch.float32, device=device)
        self.split_mixed = mixed_decode_rows_enabled()  # at startup: a bad value fails here, not at a request
        # the device decides (issue #43): our decode kernel and 8-bit cache write run once here, before graphs are
        # captured, against their references; one that fails hands its launch kind to upstream's path
        cache_dtype = vllm_config.cache_config.cache_dtype
        args = (self.headdim, vllm_config.model_config.dtype, cache_dtype, self.block_size, device)
        kernel_checks.check_decode(self.num_heads_q, self.num_heads_kv, *args)
        kernel_checks.check_kv_write(self.num_heads_kv, *args)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        base = super().build(common_prefix_len, common_attn_metadata, fast_build)
        cm = common_attn_metadata
        decode_only = (
            cm.max_query_len == 1 and cm.num_reqs == cm.num_actual_tokens and cm.num_reqs <= self.max_decode_batch
        )
        num_decodes, rest = 0, None
        if self.split_mixed and not decode_only and not base.use_cascade and base.mm_prefix_range is None:
            num_decodes = min(leading_decode_rows(cm.query_start_loc_cpu, cm.num_reqs), self.max_decode_batch)
            if 0 < num_decodes < cm.num_reqs:
                rest = self._rest_metadata(base, num_decodes, cm.num_reqs)
            else:
                num_decodes = 0
        return DcuTritonAttentionMetadata(
            **{f.name: getattr(base, f.name) for f in fields(TritonAttentionMetadata)},
            decode_only=decode_only,
            decode_workspace=self.decode_workspace,
            num_mixed_decodes=num_decodes,
            mixed_decode_seq_lens=base.seq_lens[:num_decodes] if rest is not None else None,
            mixed_rest=rest,
        )

    @staticmethod
    def _rest_metadata(base, n: int, num_reqs: int):
        """TRITON_ATTN's metadata of requests n.. of the batch (whose first n requests are one token each). New
        tensors, not views at an offset: Triton specializes pointer arguments on 16-byte alignment, and a view
        n rows into seq_lens or the block table would compile another kernel in the middle of serving."""
        return replace(
            base,
            num_actual_tokens=base.num_actual_tokens - n,
            query_start_loc=base.query_start_loc[n : num_reqs + 1] - n,
            seq_lens=base.seq_lens[n:num_reqs].clone(),
            block_table=base.block_table[n:num_reqs].clone(),
            slot_mapping=base.slot_mapping[n : base.num_actual_tokens],
        )


class DcuTritonAttentionBackend(TritonAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "DCU_TRITON_ATTN"

    @staticmethod
    def get_impl_cls() -> type["DcuTritonAttentionImpl"]:
        return DcuTritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["DcuTritonAttentionMetadataBuilder"]:
        return DcuTritonAttentionMetadataBuilder


class DcuTritonAttentionImpl(TritonAttentionImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kv_quant = kv_quant_kind(self.kv_cache_dtype)
        self.decode_path = kernel_checks.path_name("decode", self.kv_quant)  # decided at start (issue #43)
        self.use_decode_kernel = (
            self.attn_type == AttentionType.DECODER
            and self.alibi_slopes is None
            and self.sliding_window == (-1, -1)
            and not self.logits_soft_cap
            and self.sinks is None
            and self.num_queries_per_kv <= _MAX_GQA_GROUP
            and (self.kv_quant is not None or self.kv_cache_dtype in ("auto", "bfloat16", "float16"))
        )

    def forward(
        self,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output=None,
        output_scale=None,
        output_block_scale=None,
    ):
        if (
            attn_metadata is None
            or not (attn_metadata.decode_only or attn_metadata.num_mixed_decodes)
            or not self.use_decode_kernel
            or not runs_ours(self.decode_path)
            or output_scale is not None
            or output_block_scale is not None
            or query.dtype not in _DECODE_DTYPES
        ):
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata,
                output, output_scale, output_block_scale,
            )  # fmt: skip
        if attn_metadata.decode_only:
            self._decode_rows(query, kv_cache, attn_metadata, attn_metadata.seq_lens, output)
            return output
        # mixed batch: the leading one-token requests here, the rest through TRITON_ATTN with its own metadata
        n = attn_metadata.num_mixed_decodes
        self._decode_rows(query, kv_cache, attn_metadata, attn_metadata.mixed_decode_seq_lens, output)
        super().forward(layer, query[n:], key, value, kv_cache, attn_metadata.mixed_rest, output[n:])
        return output

    def _decode_rows(self, query, kv_cache, attn_metadata, seq_lens, output):
        """The split-KV kernel on the first len(seq_lens) rows of query / output."""
        n = seq_lens.shape[0]
        if self.kv_quant is None:
            k_cache, v_cache = kv_cache.unbind(1)
            k_scales = v_scales = None
        else:
            k_cache, v_cache, k_scales, v_scales = split_kv_cache(kv_cache, self.head_size, self.kv_quant)
        decode_attention(
            query[:n],
            k_cache,
            v_cache,
            attn_metadata.block_table,
            seq_lens,
            self.scale,
            output[:n],
            k_scales=k_scales,
            v_scales=v_scales,
            kv_quant=self.kv_quant,
            workspace=attn_metadata.decode_workspace,
        )

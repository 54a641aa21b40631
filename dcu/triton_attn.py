"""DCU_TRITON_ATTN: TRITON_ATTN plus a split-KV (flash-decoding) kernel for decode-only batches.

Decode-only batches (every request has one query token) go to
``vllm.dcu_kernels.decode_attention``, which spreads one sequence over enough programs to fill the
chip; prefill and mixed batches, and the features that kernel does not cover (ALiBi, sliding
window, soft cap, sinks, fused output quantization, per-tensor fp8 KV, encoder attention), go to
TRITON_ATTN's unified attention unchanged. The decode kernel reads bf16/fp16 caches and, when the
per-token-head cache dtypes exist, their uint8 codes + float32 scales.

Patch 0003-dcu-triton-decode-attention registers ``DcuTritonAttentionBackend`` as ``DCU_TRITON_ATTN`` in vLLM's
backend registry and puts it before TRITON_ATTN in ROCm's priority list; without that patch nothing imports this
module. It subclasses TRITON_ATTN's classes, so it needs vLLM (tests/test_dcu_triton_attn.py runs it against the
patched tree on the CPU).
"""

from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from vllm.dcu_kernels.decode_attention import decode_attention, workspace_numel
from vllm.dcu_kernels.kv_quant.layout import kv_quant_kind, split_kv_cache
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)

_DECODE_DTYPES = (torch.float16, torch.bfloat16)
_MAX_GQA_GROUP = 16


@dataclass
class DcuTritonAttentionMetadata(TritonAttentionMetadata):
    decode_only: bool = False  # every request has one query token: use the split-KV kernel
    decode_workspace: torch.Tensor | None = None


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

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        base = super().build(common_prefix_len, common_attn_metadata, fast_build)
        decode_only = (
            common_attn_metadata.max_query_len == 1
            and common_attn_metadata.num_reqs == common_attn_metadata.num_actual_tokens
            and common_attn_metadata.num_reqs <= self.max_decode_batch
        )
        return DcuTritonAttentionMetadata(
            **{f.name: getattr(base, f.name) for f in fields(TritonAttentionMetadata)},
            decode_only=decode_only,
            decode_workspace=self.decode_workspace,
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
            or not attn_metadata.decode_only
            or not self.use_decode_kernel
            or output_scale is not None
            or output_block_scale is not None
            or query.dtype not in _DECODE_DTYPES
        ):
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata,
                output, output_scale, output_block_scale,
            )  # fmt: skip
        num_reqs = attn_metadata.seq_lens.shape[0]
        if self.kv_quant is None:
            k_cache, v_cache = kv_cache.unbind(1)
            k_scales = v_scales = None
        else:
            k_cache, v_cache, k_scales, v_scales = split_kv_cache(kv_cache, self.head_size, self.kv_quant)
        decode_attention(
            query[:num_reqs],
            k_cache,
            v_cache,
            attn_metadata.block_table,
            attn_metadata.seq_lens,
            self.scale,
            output[:num_reqs],
            k_scales=k_scales,
            v_scales=v_scales,
            kv_quant=self.kv_quant,
            workspace=attn_metadata.decode_workspace,
        )
        return output

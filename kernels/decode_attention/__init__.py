"""Split-KV decode attention (flash-decoding) over paged bf16/fp16 or per-token-head 8-bit caches.

Modules: decode_attention (the public entry and its input checks), planning (the host's split plan and launch
decision), triton_kernels (the Triton kernel bodies), gluon_stage1 (the Gluon stage 1 for 8-bit caches on CUDA),
splits and codes (the device code both stage-1 kernels share: the split plan; the 8-bit codes and scale arithmetic),
launch_params (the launch table), reference (torch), bench / compile_check (run from the repository, not shipped).
"""
from .decode_attention import decode_attention
from .planning import workspace_numel

__all__ = ["decode_attention", "workspace_numel"]

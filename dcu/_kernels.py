"""Our kernels as dcu/ imports them: the one module that names their package.

A build installs kernels/ as ``vllm.dcu_kernels`` beside dcu/ as ``vllm.dcu`` (tools/dcubuild/tree.py PACKAGES: a
top-level ``kernels`` in the wheel could shadow another installed package of that name). In the checkout the two
folders are the top-level packages ``kernels`` and ``dcu`` (tests/test_dcu_*.py import ``dcu``). Every module of dcu/
takes what it uses of the kernels from here (``from ._kernels import decode_attention``), and this module picks the
package by the name it was itself imported under: ``vllm.dcu._kernels`` -> ``vllm.dcu_kernels``, ``dcu._kernels`` ->
``kernels``; nothing tries one name and then the other, so each dcu/ loaded resolves one copy of the kernels.

Each name is imported when it is first asked for (PEP 562 ``__getattr__``), so a module of dcu/ loads no more of the kernels than
it did importing them directly (kernels/gemv's launch tables import without Triton, kv_quant.layout without the
Triton kernels). The imports under TYPE_CHECKING are what an editor or a static reader follows: go-to-definition on
``decode_attention`` in dcu/triton_attn.py lands in kernels/decode_attention/decode_attention.py. tests/
test_tree_shape.py holds them equal to NAMES and checks that no other module of dcu/ names the kernels' package.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

PACKAGE = "vllm.dcu_kernels" if __name__.startswith("vllm.") else "kernels"

# name here -> (module under PACKAGE, its attribute; None: the module itself). A package's own export is taken from
# the package (decode_attention, prefill_attention, gemv): what a test that replaces it there replaces
NAMES = {
    "decode_attention": ("decode_attention", "decode_attention"),
    "workspace_numel": ("decode_attention", "workspace_numel"),
    "decode_params": ("decode_attention.launch_params", None),
    "paged_decode_reference": ("decode_attention.reference", "paged_decode_reference"),
    "prefill_attention": ("prefill_attention", "prefill_attention"),
    "MAX_GROUP": ("prefill_attention", "MAX_GROUP"),
    "prefill_params": ("prefill_attention.launch_params", None),
    "paged_prefill_reference": ("prefill_attention.reference", "paged_prefill_reference"),
    "layout": ("kv_quant.layout", None),
    "kv_cache_shape": ("kv_quant.layout", "kv_cache_shape"),
    "kv_quant_kind": ("kv_quant.layout", "kv_quant_kind"),
    "split_kv_cache": ("kv_quant.layout", "split_kv_cache"),
    "cache_write": ("kv_quant.cache_write", None),
    "reshape_and_cache_per_token_head": ("kv_quant.cache_write", "reshape_and_cache_per_token_head"),
    "quantize_per_token_head": ("kv_quant.reference", "quantize_per_token_head"),
    "use_software_fp8": ("fp8_e4m3", "use_software_fp8"),
    "emulated_arch": ("targets", "emulated_arch"),
    "gemv_dispatch": ("gemv.dispatch", None),
    "ShapeKey": ("gemv.dispatch", "ShapeKey"),
    "time_on_device": ("gemv.dispatch", "time_on_device"),
    "gemv_params": ("gemv.launch_params", None),
    "gemv": ("gemv", "gemv"),
    "silu_and_mul": ("gemv", "silu_and_mul"),
    "decisions": ("tuning.decisions", None),
    "runs_ours": ("tuning.decisions", "runs_ours"),
    "one_line": ("tuning.decisions", "one_line"),
    "tuned_file": ("tuning.tuned_file", None),
    "candidates": ("tuning.candidates", None),
    "merge": ("tuning.candidates", "merge"),
}

if TYPE_CHECKING:  # the checkout's names, for editors and static readers (runtime: NAMES under PACKAGE)
    from kernels.decode_attention import launch_params as decode_params
    from kernels.decode_attention import decode_attention, workspace_numel
    from kernels.decode_attention.reference import paged_decode_reference
    from kernels.fp8_e4m3 import use_software_fp8
    from kernels.gemv import dispatch as gemv_dispatch
    from kernels.gemv import launch_params as gemv_params
    from kernels.gemv.dispatch import ShapeKey, time_on_device
    from kernels.gemv import gemv, silu_and_mul
    from kernels.kv_quant import cache_write, layout
    from kernels.kv_quant.cache_write import reshape_and_cache_per_token_head
    from kernels.kv_quant.layout import kv_cache_shape, kv_quant_kind, split_kv_cache
    from kernels.kv_quant.reference import quantize_per_token_head
    from kernels.prefill_attention import launch_params as prefill_params
    from kernels.prefill_attention import MAX_GROUP, prefill_attention
    from kernels.prefill_attention.reference import paged_prefill_reference
    from kernels.targets import emulated_arch
    from kernels.tuning import candidates, decisions, tuned_file
    from kernels.tuning.candidates import merge
    from kernels.tuning.decisions import one_line, runs_ours


def __getattr__(name: str):
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = NAMES[name]
    mod = importlib.import_module(f"{PACKAGE}.{module}")
    return mod if attr is None else getattr(mod, attr)  # looked up each time: a test's monkeypatch is seen

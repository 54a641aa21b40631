"""Startup checks of our kernels on the device the engine runs on (issue #43): compile, run once, compare.

Nothing of the series has run on a DCU before its user's first start, where the DCU's own Triton compiles our kernels
for the first time. A kernel that fails to compile there, or computes something else, must not stop the engine: before
the engine serves (the attention metadata builders are made after vLLM's memory profile and before CUDA/HIP graphs
are captured), each launch kind of ours that the engine will use runs once at small shapes with the engine's cache
layout, page size and dtypes, against the torch references the test suite uses, with the suite's tolerances. A
failure hands that launch kind to upstream's path with one warning line (kernels/tuning/decisions.check_at_start),
unless its variable forced ours (then one clear error). The decision table logged at start says which runs.

Checked here: decode attention (``check_decode``, DCU_TRITON_ATTN's builder), the 8-bit KV cache write
(``check_kv_write``, the same builder and prefill's warm-up) and prefill attention (``check_prefill``, called by
vllm.dcu.prefill_attention.warmup). The GEMV checks itself when it is measured (kernels/gemv/dispatch.py).
Cost: one small launch per kind and a float32 reference (tens of milliseconds once compiled).

No vLLM import: the checks run in the tests on the CPU under Triton's interpreter.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("vllm.dcu.kernel_checks")

# (max abs error, error norm / reference norm) by query dtype: tests/test_decode_attention.py's and
# tests/test_prefill_attention.py's tolerances (P and the output are rounded to the query dtype)
DECODE_TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (4e-2, 1e-2)}
PREFILL_TOL = {torch.float16: (4e-3, 2e-3), torch.bfloat16: (4e-2, 1.2e-2)}
_16BIT = ("auto", "bfloat16", "float16")


def _kernels():
    """(decode_attention, prefill_attention, kv_quant layout, kv_quant cache_write, decode reference, prefill
    reference, decisions), as _kernels.py resolves them (imported on first use; the tests replace this function)."""
    from ._kernels import (cache_write, decisions, decode_attention, layout, paged_decode_reference,
                           paged_prefill_reference, prefill_attention)

    return decode_attention, prefill_attention, layout, cache_write, paged_decode_reference, paged_prefill_reference, \
        decisions


def attention_shape(num_heads_q: int, num_heads_kv: int, head_size: int) -> dict:
    """The engine's attention shape as the tuned file keys its attention decisions."""
    return {"heads_q": num_heads_q, "heads_kv": num_heads_kv, "head_dim": head_size}


def path_name(family: str, kv_quant: str | None) -> str:
    """The launch kind of a family for a cache: '<family>.bf16' (16-bit caches), '<family>.int8' or '.fp8'."""
    return f"{family}.{kv_quant or 'bf16'}"


def compare(out: torch.Tensor, want: torch.Tensor, tol: tuple[float, float], what: str) -> dict:
    """{"max_abs", "rel"} of ``out`` against ``want``; MismatchError naming them when ``out`` is not finite or is
    beyond (max abs, relative) ``tol``. The startup checks' comparison and the tuning command's."""
    decisions = _kernels()[-1]
    if not torch.isfinite(out).all():
        raise decisions.MismatchError(f"{what}: non-finite output")
    err = out.double() - want.double()
    max_abs = err.abs().max().item() if err.numel() else 0.0
    rel = (err.norm() / want.double().norm().clamp_min(1e-30)).item()
    if not (max_abs < tol[0] and rel < tol[1]):
        raise decisions.MismatchError(f"{what}: max abs error {max_abs:.3g}, relative {rel:.3g} (limits {tol[0]:g}, "
                                      f"{tol[1]:g})")
    return {"max_abs": round(max_abs, 6), "rel": round(rel, 6)}


def paged_case(lens: list[int], block_size: int, num_heads_kv: int, head_size: int, dtype: torch.dtype,
               kv_quant: str | None, device, seed: int = 0) -> dict:
    """A paged cache laid out as the engine's (16-bit [blocks, 2, block, heads, dim]; 8-bit kv_quant.layout's
    pages with their scales), random contents, a block table for sequences of ``lens`` tokens; block 0 (vLLM's
    null block) is left to no sequence."""
    layout = _kernels()[2]
    g = torch.Generator(device="cpu").manual_seed(seed)
    pages = [-(-n // block_size) for n in lens]
    num_blocks = 1 + sum(pages)
    table = torch.zeros(len(lens), max(pages) + 1, dtype=torch.int32)
    used = 1
    for s, n in enumerate(pages):
        table[s, :n] = torch.arange(used, used + n, dtype=torch.int32)
        used += n
    case = {"block_table": table.to(device), "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
            "num_blocks": num_blocks}
    if kv_quant is None:
        kv = torch.randn(num_blocks, 2, block_size, num_heads_kv, head_size, generator=g).to(dtype).to(device)
        case.update(k_cache=kv[:, 0], v_cache=kv[:, 1], kv=kv)
        return case
    raw = torch.zeros(layout.kv_cache_shape(num_blocks, block_size, num_heads_kv, head_size), dtype=torch.uint8)
    raw = raw.to(device)
    k, v, ks, vs = layout.split_kv_cache(raw, head_size, kv_quant)
    for codes, scales in ((k, ks), (v, vs)):
        if kv_quant == "int8":
            vals = torch.randint(-127, 128, codes.shape, generator=g, dtype=torch.int16).to(torch.int8)
            codes.copy_(vals.view(torch.uint8).to(device))
        else:  # e4m3 codes without the NaN pair (0x7F / 0xFF), either sign
            mag = torch.randint(0, 0x7F, codes.shape, generator=g, dtype=torch.int16)
            sign = torch.randint(0, 2, codes.shape, generator=g, dtype=torch.int16) * 0x80
            codes.copy_((mag | sign).to(torch.uint8).to(device))
        scales.copy_((torch.rand(scales.shape, generator=g) * 0.01 + 0.002).to(device))
    case.update(k_cache=k, v_cache=v, k_scales=ks, v_scales=vs, kv_quant=kv_quant, raw=raw)
    return case


def _kv_quant_of(cache_dtype: str):
    return _kernels()[2].kv_quant_kind(cache_dtype)


def check_decode(num_heads_q: int, num_heads_kv: int, head_size: int, dtype: torch.dtype, cache_dtype: str,
                 block_size: int, device) -> bool | None:
    """Decide and check decode.<kind> for this engine (DCU_TRITON_ATTN's metadata builder calls it); whether our
    decode kernel runs, or None for a cache dtype it does not take. Runs batch 1 and batch 2 (the balanced plan) of
    sequences over a page boundary against the float32 reference."""
    decode_attention, _, _, _, reference, _, decisions = _kernels()
    kv_quant = _kv_quant_of(cache_dtype)
    if kv_quant is None and cache_dtype not in _16BIT:
        return None
    device = torch.device(device)

    def check():
        case = paged_case([block_size + 37, 5], block_size, num_heads_kv, head_size, dtype, kv_quant, device)
        scales = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
        g = torch.Generator(device="cpu").manual_seed(1)
        q = torch.randn(2, num_heads_q, head_size, generator=g).to(dtype).to(device)
        for batch in (1, 2):
            out = torch.full_like(q[:batch], float("nan"))
            args = (case["k_cache"], case["v_cache"], case["block_table"][:batch], case["seq_lens"][:batch])
            decode_attention(q[:batch], *args, head_size**-0.5, out, **scales)
            want = reference(q[:batch], *args, head_size**-0.5, dtype=torch.float32, **scales)
            compare(out, want, DECODE_TOL[dtype], f"batch {batch}")

    return decisions.check_at_start(path_name("decode", kv_quant), check,
                                    attention_shape(num_heads_q, num_heads_kv, head_size))


def check_kv_write(num_heads_kv: int, head_size: int, dtype: torch.dtype, cache_dtype: str, block_size: int,
                   device) -> bool | None:
    """Decide and check kv_write.<kind> for an 8-bit per-token-head cache (None for other caches): our Triton
    write against the torch write it falls back to, byte for byte, for a batch that takes each write kernel (few
    tokens, and a block's worth), padded slots included."""
    _, _, layout, cache_write, _, _, decisions = _kernels()
    kv_quant = _kv_quant_of(cache_dtype)
    if kv_quant is None:
        return None
    device = torch.device(device)

    def check():
        g = torch.Generator(device="cpu").manual_seed(2)
        for tokens in (3, block_size + 5):
            num_blocks = 2 + -(-tokens // block_size)
            caches = [torch.zeros(layout.kv_cache_shape(num_blocks, block_size, num_heads_kv, head_size),
                                  dtype=torch.uint8, device=device) for _ in range(2)]
            key = torch.randn(tokens + 1, num_heads_kv, head_size, generator=g).to(dtype).to(device)
            value = torch.randn(tokens + 1, num_heads_kv, head_size, generator=g).to(dtype).to(device)
            slots = torch.arange(block_size, block_size + tokens + 1, dtype=torch.int64)  # block 0: the null block
            slots[tokens // 2] = -1  # a padded slot: skipped
            slots = slots.to(device)
            for raw, write in zip(caches, (cache_write.reshape_and_cache_per_token_head,
                                           cache_write.reshape_and_cache_torch)):
                write(key, value, *layout.split_kv_cache(raw, head_size, kv_quant), slots, kv_quant)
            ours, want = (raw[1:] for raw in caches)  # block 0 takes the torch write's padding
            if not torch.equal(ours, want):
                bad = (ours != want).sum().item()
                raise decisions.MismatchError(f"{tokens} tokens: {bad} of {want.numel()} cache bytes differ from the "
                                              "torch write")

    # the attention shape's q heads are not known here and do not matter for the write
    return decisions.check_at_start(path_name("kv_write", kv_quant), check)


def check_prefill(num_heads_q: int, num_heads_kv: int, head_size: int, dtype: torch.dtype, kv_quant: str | None,
                  block_size: int, device, mirror: int | None = None) -> bool:
    """Decide and check prefill.<kind> (vllm.dcu.prefill_attention.warmup calls it: the check is also the compile
    for the engine's layout); whether our prefill kernel runs. The batch: a 67-token chunk after a history that
    spills into a second page (with an 8-bit cache, through the engine's 16-bit ``mirror``) and a decode row (the
    8-bit caches' direct path), against the float32 reference."""
    _, prefill_attention, _, _, _, reference, decisions = _kernels()
    device = torch.device(device)

    def check():
        # the chunk's history crosses a page at every block size (at 16 tokens a history of block_size + 37 - 67 would
        # be negative: a chunk longer than its sequence)
        chunks = [67, 1]
        lens = [max(block_size, chunks[0]) + 37, 5]
        case = paged_case(lens, block_size, num_heads_kv, head_size, dtype, kv_quant, device)
        scales = {k: case[k] for k in ("k_scales", "v_scales") if k in case}
        cu = torch.tensor([0, chunks[0], sum(chunks)], dtype=torch.int32, device=device)
        g = torch.Generator(device="cpu").manual_seed(3)
        q = torch.randn(sum(chunks), num_heads_q, head_size, generator=g).to(dtype).to(device)
        out = torch.empty_like(q)
        args = (q, case["k_cache"], case["v_cache"])
        pages = (case["seq_lens"], case["block_table"], head_size**-0.5)
        prefill_attention(*args, out, cu, *pages, kv_quant=kv_quant, max_seqlen_k=max(lens), mirror=mirror, **scales)
        want = reference(*args, cu, *pages, kv_quant=kv_quant, dtype=torch.float32, **scales)
        compare(out, want, PREFILL_TOL[dtype], "warm-up batch")

    return decisions.check_at_start(path_name("prefill", kv_quant), check,
                                    attention_shape(num_heads_q, num_heads_kv, head_size))


def log_decisions(logger=None) -> bool:
    """Log the decision table once (after the warm-up); whether it was logged now."""
    return _kernels()[-1].log_table_once(logger)

"""The 8-bit KV cache write (per-token-head int8 / fp8) against the torch reference (upstream has no per-token-head
write): its codes and scales must be byte-identical, as the kernel tests require (tests/test_kv_quant.py)."""
from __future__ import annotations

import torch

from .._kernels import (kv_cache_shape, quantize_per_token_head, reshape_and_cache_per_token_head, split_kv_cache,
                       use_software_fp8)

from .common import Failed, Side, run_ours, time_us


def reference_write(key, value, views, slots, kind):
    """reference.reshape_and_cache_reference for slots that are all valid, without a host sync (capturable)."""
    k_codes, v_codes, k_scales, v_scales = views
    page = k_codes.shape[1]
    blk, off = slots // page, slots % page
    for src, codes, scales in ((key, k_codes, k_scales), (value, v_codes, v_scales)):
        c, s = quantize_per_token_head(src, kind)
        codes[blk, off] = c
        scales[blk, off] = s


class _Case:
    def __init__(self, shapes, kind, tokens, dev, scattered):
        page = shapes.pages[kind]
        blocks = -(-tokens // page) * (4 if scattered else 1) + 1
        gen = torch.Generator(device=dev).manual_seed(tokens)
        shape = (tokens, shapes.heads_kv, shapes.head_dim)
        self.key = torch.randn(shape, device=dev, generator=gen).to(torch.bfloat16)
        self.value = torch.randn(shape, device=dev, generator=gen).to(torch.bfloat16)
        if scattered:  # a decode step: one token of each of many sequences, anywhere in the cache
            self.slots = torch.randperm(blocks * page, device=dev, generator=gen)[:tokens]
        else:  # a prefill chunk: consecutive slots from a page start
            self.slots = torch.arange(page, page + tokens, device=dev)
        self.caches = [torch.zeros(kv_cache_shape(blocks, page, shapes.heads_kv, shapes.head_dim), dtype=torch.uint8,
                                   device=dev) for _ in range(2)]
        self.views = [split_kv_cache(c, shapes.head_dim, kind) for c in self.caches]
        self.kind = kind
        self.label = f"{tokens} {'scattered' if scattered else 'consecutive'}"
        self.software = kind == "fp8" and use_software_fp8()

    def ours(self):
        reshape_and_cache_per_token_head(self.key, self.value, *self.views[0], self.slots, self.kind, self.software)
        return self.caches[0]

    def reference(self):
        reference_write(self.key, self.value, self.views[1], self.slots, self.kind)
        return self.caches[1]

    def check(self):
        got = run_ours(self.ours)
        want = self.reference()
        bad = int((got != want).sum())
        if bad:
            raise Failed(f"differs from upstream: {bad} of {want.numel()} cache bytes differ from the torch "
                         f"reference at {self.label} tokens")


def run(shapes, cases, dev, rows: list, log) -> list:
    sides = []
    for kind in ("int8", "fp8"):
        built = [_Case(shapes, kind, n, dev, scattered=i == 0) for i, n in enumerate(cases.kv_write)]
        side = Side(f"kv_write.{kind}", [c.label for c in built], ours_us=[], upstream_us=[])
        for case in built:
            try:
                case.check()
            except Failed as e:
                side.failure = e.why
                break
            t = time_us({"ours": lambda i, c=case: c.ours(), "upstream": lambda i, c=case: c.reference()})
            side.ours_us.append(t["ours"])
            side.upstream_us.append(t["upstream"])
        rows.append({"phase": "kv_write", "path": side.path, "cases": side.cases, "failure": side.failure,
                     "ours_us": [round(t, 2) for t in side.ours_us],
                     "upstream_us": [round(t, 2) for t in side.upstream_us]})
        sides.append(side)
    return sides

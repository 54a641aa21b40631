"""Gluon probe 2 on the GPU (or --compile-only on the CPU): correctness against float64 for each code kind, then
time per variant at 256 programs x 32768 tokens (the KV bytes of batch 64 x 32K x 4 kv heads), against the Triton
kernel's fp8 / int8 / bf16 at batch 64 x 32K (stages 1 + 2) in the same process. Writes $OUT/gluon2.json and
prints a table last."""
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), ".gpu"))
import triton  # noqa: E402
from gluon2 import DEFAULT, compile_sm90, probe2  # noqa: E402

OUT = os.environ.get("OUT", ".")
V64 = dict(V_VEC=16, V_PHASE=4)
V128 = dict(V_VEC=32, V_PHASE=4)
VARIANTS = {
    "hw_b64_s3": dict(KIND=0),
    "hw_b64_s2": dict(KIND=0, STAGES=2),
    "hw_b64_s4": dict(KIND=0, STAGES=4),
    "hw_b128_s2": dict(KIND=0, BLOCK_N=128, STAGES=2, **V128),
    "hw_b128_s3": dict(KIND=0, BLOCK_N=128, STAGES=3, **V128),
    "hw_b64_s3_w8": dict(KIND=0, NUM_WARPS=8),
    "hw_b64_s3_kw4": dict(KIND=0, KW=4),
    "hw_b64_s3_kw2": dict(KIND=0, KW=2),
    "sw_b64_s3": dict(KIND=1),
    "sw_b64_s4": dict(KIND=1, STAGES=4),
    "sw_b128_s2": dict(KIND=1, BLOCK_N=128, STAGES=2, **V128),
    "i8_b64_s3": dict(KIND=2),
    "i8_b64_s4": dict(KIND=2, STAGES=4),
    "i8_b128_s2": dict(KIND=2, BLOCK_N=128, STAGES=2, **V128),
}


def compile_only():
    from kernels.compile_tools import nvdisasm, ptxas_usage, sass_tile_loop
    for name, kw in VARIANTS.items():
        try:
            k = compile_sm90(**kw)
            use = ptxas_usage(k.asm["ptx"], 90)
            loop = sass_tile_loop(nvdisasm(k.asm["cubin"]))
            print(f"{name:16s} shared {k.metadata.shared:7d} regs {use['regs']} spills {use['spills']} "
                  f"sass/tile {loop['instructions'] if loop else None}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:16s} ERROR {str(e)[-800:]}", flush=True)


def main():
    import torch
    dev = "cuda"
    res = {"variants": VARIANTS, "default": DEFAULT}
    t0 = time.time()

    def make(progs, n_tok, kind, seed=0):
        g = torch.Generator(device=dev).manual_seed(seed)
        k = torch.randint(0, 256, (progs, n_tok, 256), dtype=torch.uint8, device=dev, generator=g)
        v = torch.randint(0, 256, (progs, 256, n_tok), dtype=torch.uint8, device=dev, generator=g)  # V by dim
        if kind != 2:
            for t in (k, v):  # no NaN codes
                t[(t & 0x7F) == 0x7F] = 0x7E
        ks = torch.rand(progs, n_tok, device=dev, generator=g) * 0.5 + 0.5
        vs = torch.rand(progs, n_tok, device=dev, generator=g) * 0.5 + 0.5
        if kind == 2:
            ks = ks / 64
        else:
            ks = ks / 200
        q = (torch.randn(16, 256, device=dev, generator=g) * 0.5).half()
        out = torch.empty(progs, 16, 256, device=dev, dtype=torch.float32)
        return q, k, v, ks, vs, out

    def launch(a, progs, n_tok, kw):
        c = dict(DEFAULT, **kw)
        q, k, v, ks, vs, out = a
        probe2[(progs,)](q, k, v, ks, vs, out, n_tok // c["BLOCK_N"], n_tok, num_warps=c["NUM_WARPS"], **c)

    def timed(fn, iters=20):
        fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / iters * 1e3  # us

    def decode(codes, kind):
        if kind == 2:
            return codes.view(torch.int8).double()
        return codes.view(torch.float8_e4m3fn).double()

    # correctness: 2 programs x 1024 tokens against float64
    for name, kw in VARIANTS.items():
        kind = kw["KIND"]
        a = make(2, 1024, kind, seed=1)
        try:
            launch(a, 2, 1024, kw)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            res[f"{name}_error"] = str(e)[-1000:]
            print(name, "ERROR", str(e)[-1000:], flush=True)
            continue
        q, k, v, ks, vs, out = a
        errs = []
        for p in range(2):
            kd = decode(k[p], kind) * ks[p].double()[:, None]  # [tok, d]
            vd = decode(v[p], kind).t() * vs[p].double()[:, None]  # [tok, d]
            s = q.double() @ kd.t()
            w = torch.softmax(s * 0.6931471805599453, dim=1)  # base-2 scores
            ref = w @ vd
            errs.append(((out[p].double() - ref).norm() / ref.norm()).item())
        res[f"{name}_rel_err"] = max(errs)
        print(f"{name}: relative error {max(errs):.2e}", flush=True)

    # throughput: 256 programs x 32768 tokens
    progs, n_tok = 256, 32768
    byts = progs * n_tok * (512 + 8)
    data = {}
    for name, kw in VARIANTS.items():
        if f"{name}_error" in res:
            continue
        kind = kw["KIND"]
        if kind not in data:
            data.clear()
            torch.cuda.empty_cache()
            data[kind] = make(progs, n_tok, kind)
        us = timed(lambda: launch(data[kind], progs, n_tok, kw))
        res[f"{name}_us"] = us
        print(f"{name}: {us:.1f} us, {byts / us / 1e3:.0f} GB/s", flush=True)
    data.clear()
    torch.cuda.empty_cache()

    # the Triton kernel in the same process: batch 64 x 32K (stages 1 + 2)
    from kernels.decode_attention import bench
    pools = bench.Pools()
    for dt in ("bf16", "fp8_pth_hw", "fp8_pth_sw", "int8_pth"):
        try:
            c = pools.case(dt, 64, 32768, seed=0)
            fn = bench.ours_fn(c)
            res[f"triton_{dt}_us"] = timed(fn)
            print(f"triton {dt}: {res[f'triton_{dt}_us']:.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001
            res[f"triton_{dt}_error"] = str(e)[-500:]
            print("triton", dt, "ERROR", str(e)[-500:], flush=True)
    res["wall_s"] = time.time() - t0
    with open(os.path.join(OUT, "gluon2.json.tmp"), "w") as f:
        json.dump(res, f, indent=1)
    os.replace(os.path.join(OUT, "gluon2.json.tmp"), os.path.join(OUT, "gluon2.json"))
    bf = res.get("triton_bf16_us")
    print("\n| variant | us | GB/s of codes+scales | x Triton bf16 64x32K | rel err |")
    print("|---|---:|---:|---:|---:|")
    for name in list(VARIANTS) + ["triton_fp8_pth_hw", "triton_fp8_pth_sw", "triton_int8_pth"]:
        key = name if name.startswith("triton") else name
        us = res.get(f"{key}_us")
        if us is None:
            print(f"| {name} | error | | | |")
            continue
        print(f"| {name} | {us:.1f} | {byts / us / 1e3:.0f} | {us / bf:.3f} | {res.get(f'{name}_rel_err', float('nan')):.1e} |"
              if bf else f"| {name} | {us:.1f} | | | |")


if __name__ == "__main__":
    if "--compile-only" in sys.argv:
        compile_only()
    else:
        main()

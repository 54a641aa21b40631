"""Gluon probe on the GPU: fp8 decode tile loop with Q in registers and K / V codes loaded from global memory
straight into mma_v2 operand layouts (V by dim), against the Triton kernel's fp8 / bf16 at batch 64 x 32K in the same
process. Writes $OUT/gluon_probe.json and prints a table."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), ".gpu"))
import triton
from gluon_probe import probe

OUT = os.environ.get("OUT", ".")
dev = "cuda"
res = {}
t0 = time.time()


def make(progs, n_tok, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    k = torch.randint(0, 256, (progs, n_tok, 256), dtype=torch.uint8, device=dev, generator=g)
    v = torch.randint(0, 256, (progs, 256, n_tok), dtype=torch.uint8, device=dev, generator=g)  # V by dim
    for t in (k, v):  # no NaN codes
        t[(t & 0x7F) == 0x7F] = 0x7E
    ks = torch.rand(progs, n_tok, device=dev, generator=g) * 0.5 + 0.5
    vs = torch.rand(progs, n_tok, device=dev, generator=g) * 0.5 + 0.5
    q = (torch.randn(16, 256, device=dev, generator=g) * 0.05).half()
    out = torch.empty(progs, 16, 256, device=dev, dtype=torch.float32)
    return q, k, v, ks, vs, out


def launch(args, progs, n_tok, bn):
    q, k, v, ks, vs, out = args
    probe[(progs,)](q, k, v, ks, vs, out, n_tok // bn, n_tok, V_BY_DIM=True, BLOCK_N=bn, NUM_WARPS=4, num_warps=4)


def timed(fn, iters=20):
    fn(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters * 1e3  # us


# correctness: one program, 512 tokens, against float64
for bn in (64, 128):
    a = make(1, 512, seed=1)
    launch(a, 1, 512, bn)
    torch.cuda.synchronize()
    q, k, v, ks, vs, out = a
    kd = k[0].view(torch.float8_e4m3fn).double() / 256  # [tok, d]
    vd = v[0].view(torch.float8_e4m3fn).double().t() / 256  # [tok, d]
    s = q.double() @ kd.t() * ks[0].double()[None, :]
    m = (s + torch.log2(vs[0].double())[None, :]).max(dim=1, keepdim=True).values
    p = torch.exp2(s + torch.log2(vs[0].double())[None, :] - m)
    l = torch.exp2(s - m).sum(dim=1, keepdim=True)
    ref = (p @ vd) / l
    err = ((out[0].double() - ref).norm() / ref.norm()).item()
    res[f"rel_err_bn{bn}"] = err
    print(f"probe BLOCK_N {bn}: relative error {err:.2e}", flush=True)

# throughput: 264 programs (2 per SM) x 8192 tokens, KV bytes = programs x tokens x 512 (+ 8 B of scales per token)
for progs in (264, 396):
    n_tok = 8192
    a = make(progs, n_tok)
    byts = progs * n_tok * (512 + 8)
    for bn in (64, 128):
        us = timed(lambda: launch(a, progs, n_tok, bn))
        res[f"probe_p{progs}_bn{bn}_us"] = us
        res[f"probe_p{progs}_bn{bn}_GBps"] = byts / us / 1e3
        print(f"probe {progs} programs BLOCK_N {bn}: {us:.1f} us, {byts / us / 1e3:.0f} GB/s", flush=True)
    del a
    torch.cuda.empty_cache()

# the Triton kernel in the same process: batch 64 x 32K (stage 1 + 2)
from kernels.decode_attention import bench
pools = bench.Pools()
for dt in ("fp8_pth_hw", "bf16"):
    c = pools.case(dt, 64, 32768, seed=0)
    fn = bench.ours_fn(c)
    us = timed(fn)
    per_tok = 512 + 8 if dt != "bf16" else 1024
    byts = 64 * 32768 * 4 * per_tok
    res[f"triton_{dt}_64x32K_us"] = us
    res[f"triton_{dt}_64x32K_GBps"] = byts / us / 1e3
    print(f"triton {dt} 64 x 32K: {us:.1f} us, {byts / us / 1e3:.0f} GB/s", flush=True)
res["wall_s"] = time.time() - t0
json.dump(res, open(os.path.join(OUT, "gluon_probe.json"), "w"), indent=1)
print(json.dumps(res, indent=1))

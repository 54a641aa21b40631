"""One decode-attention call per dtype at a shape, for Nsight Compute: warm up, then NVTX-free plain launches that ncu
picks by kernel name (--launch-skip / --launch-count). Usage: python .gpu/ncu_decode.py BATCH CTX DTYPE [DTYPE...]"""
import os, sys
import torch
sys.path.insert(0, os.getcwd())
from kernels.decode_attention import bench

batch, ctx = int(sys.argv[1]), int(sys.argv[2])
pools = bench.Pools()
for dtype in sys.argv[3:]:
    fn = bench.ours_fn(pools.case(dtype, batch, ctx, seed=0))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    print(f"{dtype} batch {batch} ctx {ctx}: launched", flush=True)

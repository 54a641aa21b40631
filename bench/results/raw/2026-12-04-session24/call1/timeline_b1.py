"""Where batch 1's time goes inside the 8-bit decode (issue #17, twenty-fourth session): a timeline per program.

Runs with call1/timeline.diff applied (it adds TIMELINE stamps to the Gluon stage 1 and to stage 2: %globaltimer and
%clock64 after each dependent step). Each case is a CUDA graph of 8 calls on different pages, as bench.py times them;
every call writes its own timeline buffers, and the last replay's are read. Prints a table per case and writes
timeline.json under $OUT. Run from the repository root:
    python bench/results/raw/2026-12-04-session24/call1/timeline_b1.py
"""
import importlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from kernels.decode_attention import bench as B  # noqa: E402
# the module (the package exports the function of the same name)
DA = importlib.import_module("kernels.decode_attention.decode_attention")
from kernels.decode_attention import launch_params  # noqa: E402
from kernels.decode_attention import gluon_stage1 as G  # noqa: E402

OUT = os.environ.get("OUT") or sys.exit("error: set OUT to the folder for timeline.json (jobs.py sets it per job)")
CASES = [("fp8_pth_hw", 1, 4096), ("fp8_pth_hw", 1, 16384), ("fp8_pth_hw", 1, 32768), ("int8_pth", 1, 16384)]
if os.environ.get("TIMELINE_CASES"):  # JSON list of [dtype, batch, ctx, options]; options: same_pages (each call of the
    # graph on the first call's pages: translations and lines warm), block_size (the 8-bit pages' tokens)
    CASES = [tuple(c) for c in json.loads(os.environ["TIMELINE_CASES"])]
# launch variants (VLLM_DCU_DECODE_PARAMS over sm90's entry): the entry, then ones the timeline suggests
VARIANTS = json.loads(os.environ.get("TIMELINE_VARIANTS", '{"entry": null}'))
CALLS = 8
NW = 20  # tile waits stamped
P1 = ["entry", "seq_len", "block_table", "q"] + [f"w{j}" for j in range(NW)] + ["l_sum", "acc", "end"]
P2 = ["entry", "n_splits", "merged", "end"]


def _set_pages(bs):
    """The bench's 8-bit page in tokens: one BLOCK key ("8bit") when this ran, one per kind since b8b6f65."""
    for key in ("8bit", "fp8", "int8"):
        if key in B.BLOCK:
            B.BLOCK[key] = bs


def graph(fns, bufs1=None, bufs2=None):
    for i, f in enumerate(fns):
        G.TIMELINE_BUF = None if bufs1 is None else bufs1[i]
        DA.TIMELINE_STAGE2 = None if bufs2 is None else bufs2[i]
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i, f in enumerate(fns):
            G.TIMELINE_BUF = None if bufs1 is None else bufs1[i]
            DA.TIMELINE_STAGE2 = None if bufs2 is None else bufs2[i]
            f()
    G.TIMELINE_BUF = DA.TIMELINE_STAGE2 = None
    return g


def us_per_call(g, reps=50):
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps / CALLS


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    _set_pages(1552)
    pools = B.Pools()
    results = []
    pools_by_bs = {1552: pools}
    for (label, override), case_spec in [(v, c) for v in VARIANTS.items() for c in CASES]:
        dtype, batch, ctx = case_spec[:3]
        opts = case_spec[3] if len(case_spec) > 3 else {}
        bs = opts.get("block_size", 1552)
        if bs not in pools_by_bs:
            _set_pages(bs)
            pools_by_bs.clear()  # one extra pool at a time (GPU memory)
            torch.cuda.empty_cache()
            pools_by_bs[bs] = B.Pools()
        _set_pages(bs)
        pool = pools_by_bs[bs]
        if override is None:
            os.environ.pop(launch_params.ENV_VAR, None)
        else:
            os.environ[launch_params.ENV_VAR] = json.dumps(override)
        cases = [pool.case(dtype, batch, ctx, seed=0 if opts.get("same_pages") else s) for s in range(CALLS)]
        fns = [B.ours_fn(c) for c in cases]
        plain = us_per_call(graph(fns))
        b1 = torch.full((CALLS, 4096, 64), -1, dtype=torch.int64, device="cuda")
        b2 = torch.full((CALLS, 4096, 8), -1, dtype=torch.int64, device="cuda")
        g = graph(fns, b1, b2)
        stamped = us_per_call(g)
        b1.fill_(-1)
        b2.fill_(-1)
        g.replay()
        torch.cuda.synchronize()
        t1, t2 = b1.cpu(), b2.cpu()
        calls = []
        for i in range(1, CALLS - 1):  # calls with a call before and after them in the same replay
            progs = [r for r in t1[i].tolist() if r[0] >= 0]
            g0 = min(r[0] for r in progs)
            nxt = min(r[0] for r in t1[i + 1].tolist() if r[0] >= 0)
            working = [r for r in progs if r[2 * 26] >= 0 and r[63] > 0]
            pts = {}
            for k, name in enumerate(P1):
                xs = [(r[2 * k] - g0) / 1e3 for r in working if r[2 * k] >= 0]
                if xs:
                    pts[name] = dict(min=min(xs), med=med(xs), max=max(xs), n=len(xs))
            mhz = med([(r[53] - r[1]) / (r[52] - r[0]) * 1e3 for r in working if r[52] > r[0]])
            s2 = [r for r in t2[i].tolist() if r[0] >= 0]
            pts2 = {}
            for k, name in enumerate(P2):
                xs = [(r[k] - g0) / 1e3 for r in s2 if r[k] >= 0]
                if xs:
                    pts2[name] = dict(min=min(xs), med=med(xs), max=max(xs), n=len(xs))
            tiles = sorted(set(r[63] for r in working))
            sms = len(set(r[62] for r in progs))
            # per-program steps (us): each program's own deltas, median over programs
            steps = {}
            for a, b, name in ((0, 1, "seq_len load"), (1, 2, "block table load"), (2, 3, "issue + q"),
                               (3, 4, "first tile wait"), (24, 25, "acc done"), (25, 26, "store")):
                steps[name] = med([(r[2 * b] - r[2 * a]) / 1e3 for r in working if r[2 * a] >= 0 and r[2 * b] >= 0])
            periods = []
            for r in working:
                ws = [r[2 * (4 + j)] for j in range(NW) if r[2 * (4 + j)] >= 0]
                periods += [(y - x) / 1e3 for x, y in zip(ws, ws[1:])]
            steps["tile period"] = med(periods)
            steps["last wait -> l_sum"] = med([(r[48] - max(r[2 * (4 + j)] for j in range(NW))) / 1e3
                                               for r in working if r[63] <= NW])
            calls.append(dict(call=i, programs=len(progs), working=len(working), sms=sms, tiles=tiles, mhz=mhz,
                              stage1=pts, stage2=pts2, next_call=(nxt - g0) / 1e3, steps=steps,
                              ticks=sorted(set((r[0] % 1000) for r in progs))[:8]))
        results.append(dict(variant=label, override=override, dtype=dtype, batch=batch, ctx=ctx, opts=opts,
                            us_plain=plain,
                            us_stamped=stamped, calls=calls))
        print(f"[{label}] {dtype} {batch}x{ctx} {opts}: {plain:.1f} us plain, {stamped:.1f} us stamped", flush=True)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "timeline.json.tmp"), "w") as f:
        json.dump(results, f, indent=1)
    os.replace(os.path.join(OUT, "timeline.json.tmp"), os.path.join(OUT, "timeline.json"))
    # table: medians over the 6 inner calls of each point's median (us from the call's first stage-1 entry)
    for r in results:
        print(f"\n## [{r['variant']}] {r['dtype']} batch {r['batch']} x {r['ctx']} {r['opts']}: "
              f"{r['us_plain']:.1f} us/call plain, "
              f"{r['us_stamped']:.1f} stamped; {r['calls'][0]['programs']} programs on {r['calls'][0]['sms']} SMs, "
              f"tiles per program {r['calls'][0]['tiles']}, SM clock ~{r['calls'][0]['mhz']:.0f} MHz, "
              f"globaltimer low digits {r['calls'][0]['ticks']}")
        print("| point | min | med | max |\n|---|---:|---:|---:|")
        for name in P1:
            xs = [c["stage1"][name] for c in r["calls"] if name in c["stage1"]]
            if xs:
                print(f"| s1 {name} | {med([x['min'] for x in xs]):.2f} | {med([x['med'] for x in xs]):.2f} | "
                      f"{med([x['max'] for x in xs]):.2f} |")
        for name in P2:
            xs = [c["stage2"][name] for c in r["calls"] if name in c["stage2"]]
            if xs:
                print(f"| s2 {name} | {med([x['min'] for x in xs]):.2f} | {med([x['med'] for x in xs]):.2f} | "
                      f"{med([x['max'] for x in xs]):.2f} |")
        print(f"| next call's s1 entry | {med([c['next_call'] for c in r['calls']]):.2f} | | |")
        print("| step (per program, median) | us |\n|---|---:|")
        for name in r["calls"][0]["steps"]:
            print(f"| {name} | {med([c['steps'][name] for c in r['calls']]):.2f} |")


if __name__ == "__main__":
    main()

"""Engine-level equivalence (issue #15): one engine's logprobs on fixed prompts, written by a worker process.

Used by tests/gpu/test_engine_equivalence.py and bench/kv_drift.py, with bench/logprob_tolerance.py (the
tolerances, derived from bf16 / 8-bit rounding) and bench/logprob_compare.py (two runs compared against them, the
report rows); all of it is tested on the CPU in tests/test_logprob_eq.py (the worker on a fake engine).

Worker (one engine configuration per process, on the GPU harness: the variant on PYTHONPATH, engine in-process):

    python -m bench.logprob_eq --worker '{"name": ..., "backend": ..., "kv": ..., "out_dir": ..., ...}'

builds a Qwen3.5-27B-shaped model of ``layers`` layers (ci/gpu/dummy_model.py) with the scaled dummy weights of
ci/gpu/scaled_weights.py (logits with std ``logit_std`` over the vocabulary, attention scores with std
``score_std``), compilation mode NONE with full CUDA graphs for decode (sizes 1, 2, 4), prefix caching off, and
for each prompt length a prompt of random token ids (the same in every configuration, from ``seed``) runs one
greedy request of ``steps`` + 1 tokens with ``logprobs=-1`` (the full vector of every sampled position) and
``prompt_logprobs=0`` (each prompt token's logprob). Writes ``len<N>.npz`` (tokens, logprobs [steps + 1, vocab],
prompt_lp [N - 1], prompt ids) and ``meta.json`` into ``out_dir``; with ``probe`` also ``probe.npz``: the first
token's logprobs for the shortest prompt with its first half replaced (positions the linear-attention layers have
forgotten: what changes reaches the last position through full attention only).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

from bench.logprob_tolerance import KV_MODE

REPO = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def _load(name: str, path: Path):
    """A repository file as a module, once per process (registered under a vllm_dcu_ name: dataclasses need
    their module in sys.modules)."""
    key = f"vllm_dcu_{name}"
    spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod


def prompt_ids(seed: int, length: int, vocab: int) -> list[int]:
    """The prompt of ``length`` random token ids (away from the ids near both ends of the vocabulary)."""
    rnd = random.Random(f"{seed}:{length}")
    return [rnd.randrange(1000, vocab - 1000) for _ in range(length)]


def probe_ids(ids: list[int], seed: int, vocab: int) -> list[int]:
    """``ids`` with its first half replaced by other random ids (same length, same second half)."""
    rnd = random.Random(f"probe:{seed}:{len(ids)}")
    half = len(ids) // 2
    return [rnd.randrange(1000, vocab - 1000) for _ in range(half)] + list(ids[half:])


def _positions(lp):
    """(token ids, logprobs) per position of vLLM's sample/prompt logprobs: FlatLogprobs or a list of dicts
    (None for a position without logprobs)."""
    if hasattr(lp, "start_indices"):
        for s, e in zip(lp.start_indices, lp.end_indices):
            yield (None if s == e else (lp.token_ids[s:e], lp.logprobs[s:e]))
    else:
        for d in lp:
            yield None if not d else (list(d.keys()), [v.logprob for v in d.values()])


def dense_logprobs(lp, vocab: int):
    """[positions, vocab] float32 from logprobs returned with logprobs=-1; every entry must be present."""
    import numpy as np

    rows = []
    for i, pos in enumerate(_positions(lp)):
        row = np.full(vocab, np.nan, dtype=np.float32)
        if pos is None:
            raise ValueError(f"position {i} has no logprobs")
        ids, vals = pos
        row[np.asarray(ids, dtype=np.int64)] = np.asarray(vals, dtype=np.float32)
        if np.isnan(row).any():
            raise ValueError(f"position {i}: {int(np.isnan(row).sum())} of {vocab} logprobs missing "
                             "(was logprobs=-1 with max_logprobs=-1 requested?)")
        rows.append(row)
    return np.stack(rows)


def prompt_token_logprobs(lp, ids: list[int]):
    """float32 [len(ids) - 1]: the logprob of each prompt token after the first, from prompt_logprobs."""
    import numpy as np

    out = np.full(len(ids) - 1, np.nan, dtype=np.float32)
    for i, pos in enumerate(_positions(lp)):
        if i == 0:
            continue
        if pos is None:
            raise ValueError(f"prompt position {i} has no logprob")
        tok, vals = pos
        try:
            out[i - 1] = vals[list(tok).index(ids[i])]
        except ValueError:
            raise ValueError(f"prompt position {i}: token {ids[i]} not among its logprobs") from None
    if np.isnan(out).any():
        raise ValueError(f"{int(np.isnan(out).sum())} prompt positions without a logprob")
    return out


def ids_sha(ids) -> str:
    return hashlib.sha256(json.dumps(list(map(int, ids))).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ worker
def scales(d: dict | None):
    """ci/gpu/scaled_weights.py's Scales from a configuration's ``scales`` dict (missing keys: the defaults)."""
    return _load("scaled_weights", REPO / "ci" / "gpu" / "scaled_weights.py").Scales.from_dict(d)


def engine_kwargs(harness, model: str, cfg: dict, load_format: str) -> dict:
    """LLM(...) arguments of one configuration: the harness's, cheap to start (mode NONE, 3 graph sizes)."""
    return harness.engine_kwargs(
        model, attention_backend=cfg["backend"], kv_cache_dtype=cfg["kv"], max_model_len=cfg["max_len"],
        max_num_seqs=4, max_num_batched_tokens=4096, gpu_memory_utilization=cfg.get("gpu_memory_utilization", 0.5),
        enable_prefix_caching=False, max_logprobs=-1, load_format=load_format,
        model_loader_extra_config=scales(cfg.get("scales")).to_dict(), seed=0,
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]})


def sampling_params(cls, n_tokens: int, prompt_lp: bool):
    """Greedy, ``n_tokens`` tokens, the full logprob vector of each (flat: a few lists, not 248320 objects per
    position), and each prompt token's logprob when ``prompt_lp``."""
    return cls(max_tokens=n_tokens, temperature=0.0, ignore_eos=True, detokenize=False, logprobs=-1,
               prompt_logprobs=0 if prompt_lp else None, flat_logprobs=True)


def worker(cfg: dict) -> None:
    import numpy as np

    dummy = _load("dummy_model", REPO / "ci" / "gpu" / "dummy_model.py")
    harness = _load("harness", REPO / "ci" / "gpu" / "harness.py")
    sw = _load("scaled_weights", REPO / "ci" / "gpu" / "scaled_weights.py")
    model = dummy.write_config(Path(cfg["model_dir"]), cfg["layers"])
    fmt = sw.register_loader()
    import vllm
    from vllm import LLM, SamplingParams

    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(harness, str(model), cfg, fmt))
    start_s = time.perf_counter() - t0
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    steps = cfg["steps"]
    meta = dict(name=cfg["name"], backend=cfg["backend"], kv=cfg["kv"], version=vllm.__version__, vocab=vocab,
                layers=cfg["layers"], scales=scales(cfg.get("scales")).to_dict(), steps=steps,
                start_s=round(start_s, 1), lengths={})

    def run(ids, n_tokens, prompt_lp):
        sp = sampling_params(SamplingParams, n_tokens, prompt_lp)
        return llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]

    for n in cfg["lengths"]:
        ids = prompt_ids(cfg["seed"], n, vocab)
        t = time.perf_counter()
        o = run(ids, steps + 1, True)
        wall = time.perf_counter() - t
        c = o.outputs[0]
        tokens = np.asarray(c.token_ids, dtype=np.int64)
        lps = dense_logprobs(c.logprobs, vocab)
        if len(tokens) != steps + 1 or lps.shape[0] != steps + 1:
            raise RuntimeError(f"length {n}: {len(tokens)} tokens / {lps.shape[0]} logprob rows, want {steps + 1}")
        plp = prompt_token_logprobs(o.prompt_logprobs, ids)
        np.savez(out / f"len{n}.npz", tokens=tokens, logprobs=lps, prompt_lp=plp,
                 prompt=np.asarray(ids, dtype=np.int32))
        meta["lengths"][str(n)] = dict(wall_s=round(wall, 2), prompt_sha=ids_sha(ids))
        print(f"logprob-eq {cfg['name']}: length {n} in {wall:.2f} s, tokens {tokens.tolist()}", flush=True)
    if cfg.get("probe"):
        n = min(cfg["lengths"])
        ids = probe_ids(prompt_ids(cfg["seed"], n, vocab), cfg["seed"], vocab)
        c = run(ids, 1, False).outputs[0]
        np.savez(out / "probe.npz", logprobs=dense_logprobs(c.logprobs, vocab), length=np.int64(n))
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


# Everything but attention is held equal between the compared engines: the decode GEMMs (patch 0007) take the
# platform GEMM in every configuration instead of whichever side a startup timing picked.
PINNED_ENV = {"VLLM_DCU_GEMV": "off"}


def make_config(name: str, backend: str, kv: str, *, work, layers: int, lengths, steps: int, seed: int = 0,
                scales_dict: dict | None = None, probe: bool = False, env: dict | None = None) -> dict:
    """A worker configuration; its files go to <work>/<name>, the model folder is shared per layer count."""
    lengths = sorted(int(n) for n in lengths)
    if not lengths or lengths[0] < 2:
        raise ValueError(f"prompt lengths must be >= 2 tokens, got {lengths}")
    if KV_MODE.get(kv) is None:
        raise ValueError(f"kv must be one of {sorted(KV_MODE)}, got {kv!r}")
    work = Path(work)
    return dict(name=name, backend=backend, kv=kv, layers=int(layers), lengths=lengths, steps=int(steps),
                seed=int(seed), scales=scales(scales_dict).to_dict(), probe=bool(probe),
                env={**PINNED_ENV, **(env or {})},
                max_len=lengths[-1] + int(steps) + 64, model_dir=str(work / f"model-l{layers}"),
                out_dir=str(work / name))


def launch(cfg: dict, env: dict, timeout_s: float, log_path) -> tuple[bool, str]:
    """Run the worker for ``cfg`` in its own process (``python -m bench.logprob_eq`` in the repository root;
    ``env``: the harness variant's, plus cfg['env']); (finished with its files written, log tail)."""
    import subprocess

    env = dict(env)
    env.update(cfg.get("env") or {})
    (Path(cfg["out_dir"]) / "meta.json").unlink(missing_ok=True)  # a stale result must not pass for this run's
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "bench.logprob_eq", "--worker", json.dumps(cfg)],
                                env=env, stdout=f, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            import signal

            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = f"killed after {timeout_s:.0f} s"
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
    ok = rc == 0 and (Path(cfg["out_dir"]) / "meta.json").is_file()
    return ok, (tail if ok else f"worker {cfg['name']} failed ({rc}):\n{tail}")


def load_run(folder) -> dict:
    """{'meta': ..., 'lengths': {n: {tokens, logprobs, prompt_lp, prompt}}, 'probe': logprobs or None}."""
    import numpy as np

    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    run = {"meta": meta, "lengths": {}, "probe": None}
    for n in meta["lengths"]:
        with np.load(folder / f"len{n}.npz") as f:
            run["lengths"][int(n)] = {k: f[k] for k in f.files}
    if (folder / "probe.npz").is_file():
        with np.load(folder / "probe.npz") as f:
            run["probe"] = f["logprobs"][0]
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", required=True, help="configuration as JSON (see worker())")
    a = ap.parse_args(argv)
    worker(json.loads(a.worker))
    return 0


if __name__ == "__main__":
    sys.exit(main())

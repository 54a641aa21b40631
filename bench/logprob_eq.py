"""Engine-level equivalence (issue #15): one engine's logprobs on fixed prompts, their comparison, and the
tolerances, derived from bf16 / 8-bit rounding.

Used by tests/gpu/test_engine_equivalence.py and bench/kv_drift.py; the CPU parts (tolerances, comparison,
report) are tested in tests/test_logprob_eq.py.

Worker (one engine configuration per process, on the GPU harness: the variant on PYTHONPATH, engine in-process):

    python bench/logprob_eq.py --worker '{"name": ..., "backend": ..., "kv": ..., "out_dir": ..., ...}'

builds a Qwen3.5-27B-shaped model of ``layers`` layers (ci/gpu/dummy_model.py) with the scaled dummy weights of
ci/gpu/scaled_weights.py (logits with std ``logit_std`` over the vocabulary, attention scores with std
``score_std``), compilation mode NONE with full CUDA graphs for decode (sizes 1, 2, 4), prefix caching off, and
for each prompt length a prompt of random token ids (the same in every configuration, from ``seed``) runs one
greedy request of ``steps`` + 1 tokens with ``logprobs=-1`` (the full vector of every sampled position) and
``prompt_logprobs=0`` (each prompt token's logprob). Writes ``len<N>.npz`` (tokens, logprobs [steps + 1, vocab],
prompt_lp [N - 1], prompt ids) and ``meta.json`` into ``out_dir``; with ``probe`` also ``probe.npz``: the first
token's logprobs for the shortest prompt with its first half replaced (positions the linear-attention layers have
forgotten: what changes reaches the last position through full attention only).

Tolerances (``derive``; the derivation, with its numbers, is also printed in the reports and written next to the
GPU test):

1. Attention-level relative error eps (RMS error of a full-attention layer's output / RMS of the output):
   * two bf16-KV kernels (TRITON_ATTN vs DCU_TRITON_ATTN decode): each rounds P to bf16 before P.V and its output
     to bf16 (unit roundoff u = 2^-8; a uniform rounding error has RMS u / sqrt(3)), independently:
     eps = sqrt(2 engines x 2 roundings) x u / sqrt(3) = 2u / sqrt(3) = 4.5e-3;
   * 8-bit KV vs bf16 KV: the 8-bit cache's relative RMS error r of a head vector (measured with the cache's own
     quantizer, kernels/kv_quant/reference.py, on N(0, 1) vectors of head_dim: int8 7.0e-3, fp8 2.6e-2 at 256)
     enters the scores as score_std x r (K; the scores are N(0, score_std^2) by construction) and the output as r
     (V); plus both sides' rounding (bf16 side: P and output bf16; 8-bit side: P fp16 (u = 2^-11), output bf16):
     eps = sqrt((score_std r)^2 + r^2 + rounding^2) (int8 0.022, fp8 0.083 at score_std 3): an upper estimate,
     a score error moves the output by at most its own size relative to it.
2. Propagation to the logits: the change of the logprobs has standard deviation
   sigma = logit_std x sqrt((P x eps)^2 + F^2) over the vocabulary.
   * P: how much of an attention error reaches the final hidden state (linearly). bench/equiv_sim.py (this model
     and these weights at reduced width, the comparisons' error models, float64 elsewhere;
     ``python bench/equiv_sim.py --f64``, 256 and 384 tokens, 3 seeds) measured 0.12-0.21 with one full-attention
     layer, 0.23-0.41 with two, 0.32-0.54 with three, 0.47-0.70 with four; 0.25 per full-attention layer bounds
     it (PROPAGATION_PER_ATTN_LAYER).
   * F: the engine stores every activation in bf16. Once two engines' values differ at all, each later rounding
     turns a difference below one bf16 step into a whole step or none (variance ~ difference x step): the
     difference does not shrink below rounding level and accumulates layer by layer. The simulation with bf16
     everywhere (``python bench/equiv_sim.py``, 256 tokens, 3 seeds) measured F = drift / logit_std = 0.003 /
     0.012 / 0.020 / 0.026 at 4 / 8 / 12 / 16 layers for two bf16 kernels; 0.5 u per layer (u = 2^-8:
     0.0078 / 0.0156 / 0.023 / 0.031) bounds it (FLOOR_PER_LAYER_U). It dominates the bf16-kernel comparison
     (P x eps ~ 2e-3) and is comparable to the 8-bit ones.
   tests/test_logprob_eq.py checks both bounds and the limits below against the simulation.
3. Limits (margin M = 2 on the predicted size): the largest change over the vocabulary of one position's
   logprobs: M x z(vocab) x sigma + one bf16 step of the largest logit (logits are bf16: a change may round a
   logit a whole step; 0.125 at logit_std 3 over 248320 tokens) with z(n) = sqrt(2 ln n) + 1.5 (the largest of n
   Gaussian draws, plus room for the heavier tails near-tied attention gives); KL(ref || other) of one position:
   (M sigma)^2 / 2 (KL ~ the variance of the change / 2); the prompt tokens' logprobs: RMS change M x sigma,
   largest change M x z(prompt length) x sigma + one bf16 step of logit_std x z(prompt length).
Greedy steps are compared while both engines have produced the same tokens, including the step where they first
differ (its context is still the same); a divergence is then within tolerance by the per-step check (the two
tokens' logprobs are within 2 x the limit of each other in the reference).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

U_BF16 = 2.0**-8
U_FP16 = 2.0**-11
PROPAGATION_PER_ATTN_LAYER = 0.25
FLOOR_PER_LAYER_U = 0.5  # bf16 re-rounding floor: 0.5 u per layer of relative change of the final hidden state
MARGIN = 2.0
Z_EXTRA = 1.5
MODES = ("bf16-kernels", "int8", "fp8")
KV_MODE = {"auto": "bf16", "bfloat16": "bf16", "int8_per_token_head": "int8", "fp8_per_token_head": "fp8"}


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


# ------------------------------------------------------------------------------------------------ tolerances
def z(n: int) -> float:
    """Multiple of the standard deviation the largest |change| of n draws may reach: sqrt(2 ln n) + Z_EXTRA."""
    return math.sqrt(2.0 * math.log(max(n, 2))) + Z_EXTRA


@functools.lru_cache(maxsize=None)
def quant_rel_error(kind: str, head_dim: int, rows: int = 4096, seed: int = 0) -> float:
    """Relative RMS error of one (token, head) vector of N(0, 1) values stored by the 8-bit cache's quantizer
    (scale = absmax / QMAX per vector, so the result does not depend on the vector's magnitude)."""
    import torch

    from kernels.kv_quant.reference import fake_quantize  # run from the repository root (python -m bench....)

    x = torch.randn(rows, head_dim, generator=torch.Generator().manual_seed(seed))
    err = fake_quantize(x, f"{kind}_pth") - x
    return float((err.pow(2).mean() / x.pow(2).mean()).sqrt())


def rounding_eps(kv: str) -> float:
    """RMS relative rounding error of one engine's attention output: P and the output rounded (uniform errors)."""
    u_p = U_FP16 if kv in ("int8", "fp8") else U_BF16
    return math.sqrt(u_p**2 + U_BF16**2) / math.sqrt(3.0)


def attention_eps(mode: str, score_std: float, head_dim: int) -> dict:
    """eps of ``mode`` and its parts (see the module docstring, step 1)."""
    if mode == "bf16-kernels":
        parts = {"rounding": math.hypot(rounding_eps("bf16"), rounding_eps("bf16"))}
    elif mode in ("int8", "fp8"):
        r = quant_rel_error(mode, head_dim)
        parts = {"k_scores": score_std * r, "v": r, "rounding": math.hypot(rounding_eps("bf16"), rounding_eps(mode)),
                 "r": r}
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    parts["eps"] = math.sqrt(sum(v * v for k, v in parts.items() if k != "r"))
    return parts


def propagation(layers: int) -> float:
    """Upper bound of P (module docstring, step 2) for a model with full attention on every 4th layer."""
    return PROPAGATION_PER_ATTN_LAYER * max(1, layers // 4)


def rounding_floor(layers: int) -> float:
    """Upper bound of F (module docstring, step 2): the relative change of the final hidden state that bf16
    re-rounding alone leaves between two engines whose values differ at all."""
    return FLOOR_PER_LAYER_U * U_BF16 * layers


def bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


@dataclass(frozen=True)
class Tolerance:
    mode: str
    eps: float
    sigma: float
    step_max_abs: float
    step_kl: float
    prompt_rms: float
    prompt_max_abs: float
    derivation: str

    def to_dict(self) -> dict:
        return asdict(self)


def derive(mode: str, *, layers: int, vocab: int, prompt_len: int, logit_std: float, score_std: float,
           head_dim: int = 256, margin: float = MARGIN) -> Tolerance:
    """The limits of a comparison of ``mode`` (module docstring)."""
    parts = attention_eps(mode, score_std, head_dim)
    p, f = propagation(layers), rounding_floor(layers)
    sigma = logit_std * math.hypot(p * parts["eps"], f)
    ulp_top, ulp_prompt = bf16_ulp(logit_std * z(vocab)), bf16_ulp(logit_std * z(prompt_len))
    step_max = margin * z(vocab) * sigma + ulp_top
    prompt_max = margin * z(prompt_len) * sigma + ulp_prompt
    shown = ", ".join(f"{k} {v:.3g}" for k, v in parts.items() if k != "eps")
    text = (f"{mode}: eps = {parts['eps']:.3g} ({shown}); sigma = logit_std {logit_std:g} x sqrt((P {p:g} x eps)^2 "
            f"+ F {f:.3g}^2) ({layers} layers) = {sigma:.3g}; limits with margin {margin:g}: step max |d logprob| "
            f"{margin:g} x z({vocab}) {z(vocab):.2f} x sigma + bf16 ulp of the top logit {ulp_top:g} = "
            f"{step_max:.3g}, step KL (M sigma)^2 / 2 = {(margin * sigma) ** 2 / 2:.3g}, prompt RMS "
            f"{margin * sigma:.3g}, prompt max {margin:g} x z({prompt_len}) {z(prompt_len):.2f} x sigma + "
            f"{ulp_prompt:g} = {prompt_max:.3g}")
    return Tolerance(mode=mode, eps=parts["eps"], sigma=sigma, step_max_abs=step_max,
                     step_kl=(margin * sigma) ** 2 / 2, prompt_rms=margin * sigma, prompt_max_abs=prompt_max,
                     derivation=text)


def comparison_mode(ref_cfg: dict, other_cfg: dict) -> str:
    """Which error model a pair of configurations is compared under."""
    a, b = KV_MODE.get(ref_cfg["kv"]), KV_MODE.get(other_cfg["kv"])
    if a is None or b is None:
        raise ValueError(f"unknown KV dtype in {ref_cfg['kv']!r} / {other_cfg['kv']!r}")
    if a == b == "bf16":
        return "bf16-kernels"
    if a == "bf16" and b in ("int8", "fp8"):
        return b
    raise ValueError(f"no error model for {a} vs {b} (the reference must be bf16 KV)")


# ------------------------------------------------------------------------------------------------ logprobs
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
    """Run the worker for ``cfg`` in its own process (``env``: the harness variant's, plus cfg['env']);
    (finished with its files written, log tail)."""
    import subprocess

    env = dict(env)
    env.update(cfg.get("env") or {})
    (Path(cfg["out_dir"]) / "meta.json").unlink(missing_ok=True)  # a stale result must not pass for this run's
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as f:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)],
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


# ------------------------------------------------------------------------------------------------ comparison
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


def _kl(ref_lp, other_lp) -> float:
    import numpy as np

    a = ref_lp.astype(np.float64)
    return float((np.exp(a) * (a - other_lp.astype(np.float64))).sum())


def compare_length(ref: dict, other: dict) -> dict:
    """Metrics of one prompt length: every sampled position while the tokens agree (through the first
    difference), and the prompt tokens' logprobs."""
    import numpy as np

    if not np.array_equal(ref["prompt"], other["prompt"]):
        raise ValueError("the two runs used different prompts")
    steps = []
    diverged_at = None
    for t in range(min(len(ref["tokens"]), len(other["tokens"]))):
        a, b = ref["logprobs"][t], other["logprobs"][t]
        finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
        d = np.abs(b.astype(np.float64) - a) if finite else np.array([np.inf])
        steps.append(dict(step=t, max_abs=float(d.max()), kl=_kl(a, b) if finite else math.inf,
                          same_token=bool(ref["tokens"][t] == other["tokens"][t]), finite=finite))
        if ref["tokens"][t] != other["tokens"][t]:
            diverged_at = t
            gap = float(a[ref["tokens"][t]] - a[other["tokens"][t]])
            steps[-1]["ref_gap"] = gap  # reference logprob of its token minus of the other's
            break
    dp = other["prompt_lp"].astype(np.float64) - ref["prompt_lp"]
    prompt_finite = bool(np.isfinite(dp).all())
    return dict(
        steps=steps, steps_compared=len(steps), diverged_at=diverged_at,
        first_max_abs=steps[0]["max_abs"], first_kl=steps[0]["kl"],
        step_max_abs=max(s["max_abs"] for s in steps), step_kl=max(s["kl"] for s in steps),
        prompt_rms=float(np.sqrt(np.mean(dp * dp))) if prompt_finite else math.inf,
        prompt_max_abs=float(np.abs(dp).max()) if prompt_finite else math.inf,
        prompt_argmax=int(np.abs(dp).argmax()) + 1 if prompt_finite else None,
        finite=prompt_finite and all(s["finite"] for s in steps),
        bit_identical=bool(all(s["max_abs"] == 0 for s in steps) and not np.any(dp)),
    )


def compare(ref_run: dict, other_run: dict) -> dict:
    """{length: compare_length(...)} over the lengths both runs have."""
    common = sorted(set(ref_run["lengths"]) & set(other_run["lengths"]))
    if not common:
        raise ValueError("the runs share no prompt length")
    return {n: compare_length(ref_run["lengths"][n], other_run["lengths"][n]) for n in common}


def tolerances_for(ref_meta: dict, other_meta: dict, lengths, margin: float = MARGIN) -> dict:
    """{length: Tolerance} for comparing two runs (their configurations decide the error model)."""
    mode = comparison_mode(ref_meta, other_meta)
    sc = scales(ref_meta["scales"])
    if sc != scales(other_meta["scales"]) or ref_meta["layers"] != other_meta["layers"]:
        raise ValueError("the runs used different weights (scales or layers)")
    return {n: derive(mode, layers=ref_meta["layers"], vocab=ref_meta["vocab"], prompt_len=n - 1,
                      logit_std=sc.logit_std, score_std=sc.score_std, margin=margin) for n in lengths}


CHECKS = (("step_max_abs", "step max |d logprob|"), ("step_kl", "step KL"), ("prompt_rms", "prompt RMS"),
          ("prompt_max_abs", "prompt max |d logprob|"))


def check(metrics: dict, tol: dict) -> list[str]:
    """Failures (empty when every length is within its limits and finite)."""
    bad = []
    for n, m in sorted(metrics.items()):
        if not m["finite"]:
            bad.append(f"length {n}: non-finite logprobs")
            continue
        for key, label in CHECKS:
            lim = getattr(tol[n], key)
            if m[key] > lim:
                bad.append(f"length {n}: {label} {m[key]:.4g} > limit {lim:.4g}")
    return bad


def ratios(metrics: dict, tol: dict) -> dict:
    """Measured / limit per check and length (1 = at the limit): how much room the derivation left."""
    return {n: {key: round(m[key] / getattr(tol[n], key), 4) if getattr(tol[n], key) > 0 else None
                for key, _ in CHECKS} for n, m in sorted(metrics.items())}


def report_rows(pair: str, metrics: dict, tol: dict) -> list[str]:
    """Markdown table rows (see REPORT_HEADER) for one compared pair."""
    rows = []
    for n, m in sorted(metrics.items()):
        t = tol[n]
        div = "-" if m["diverged_at"] is None else str(m["diverged_at"])
        rows.append(
            f"| {pair} | {n} | {m['first_max_abs']:.3g} | {m['first_kl']:.3g} | {m['step_max_abs']:.3g} / "
            f"{t.step_max_abs:.3g} | {m['step_kl']:.3g} / {t.step_kl:.3g} | {m['prompt_rms']:.3g} / {t.prompt_rms:.3g} "
            f"| {m['prompt_max_abs']:.3g} / {t.prompt_max_abs:.3g} | {m['steps_compared']} | {div} | "
            f"{'yes' if m['bit_identical'] else 'no'} |")
    return rows


REPORT_HEADER = [
    "| pair | prompt tokens | first token max abs | first token KL | step max abs / limit | step KL / limit | "
    "prompt RMS / limit | prompt max abs / limit | steps compared | first different token | bit-identical |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", required=True, help="configuration as JSON (see worker())")
    a = ap.parse_args(argv)
    worker(json.loads(a.worker))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Dummy weights at scales where a Qwen3.5-shaped model's outputs depend on its attention (issue #15).

vLLM's dummy loader draws every weight from U(-1e-3, 1e-3): activations shrink layer by layer, the logits are
flat (every token ~ -ln(vocab)) and no output depends on what attention reads, so two attention backends or KV
dtypes cannot be told apart through the engine. This module re-initialises a model built by vLLM (any
load_format) so that

* the embedding rows are N(0, embed_std^2): the residual stream starts at RMS ~1;
* every linear layer (including the fused qkv / gate_up / in_proj_qkvz ones) is N(0, (gain / sqrt(fan_in))^2),
  which keeps the RMS of its input (vLLM stores [out, in], so fan_in = shape[1]; the depthwise conv1d of the
  GDN layers [channels, 1, kernel] uses fan_in = kernel);
* the RMSNorms have gain 1 (GemmaRMSNorm computes x * (1 + w): w = 0; RMSNormGated computes x * w: w = 1),
  except the attention's q_norm / k_norm, whose gain g makes the scores q.k / sqrt(head_dim) of the unit-RMS
  q and k an N(0, g^4) variable: ``score_std`` = g^2 sets how peaked attention is (3: a few keys carry most of
  the weight at 1K-32K tokens of random context);
* the lm_head is N(0, (logit_std / sqrt(hidden))^2): the logits of the unit-RMS final hidden state have standard
  deviation logit_std over the vocabulary (3 over 248320 tokens: the top token has p ~ 0.1-0.2, neither flat
  nor one-hot);
* the GDN gates are constants: A_log = a_log, dt_bias = dt_bias (decay exp(-exp(a_log) softplus(a + dt_bias))
  per token, ~0.95 at the defaults: the linear-attention layers remember ~20 tokens, so what the model's last
  position knows about tokens further back comes through the full-attention layers).

Values are drawn per parameter from a generator seeded by crc32(seed, parameter name) on the parameter's device,
so two engine starts on the same kind of GPU get bit-identical weights whatever their attention backend or KV
dtype (with tensor parallelism each rank draws its own shard: deterministic, but not one global matrix). A
parameter that matches no rule is an error, never left as torch.empty.

In the engine: ``register_loader()`` (in the process that builds the model: the offline LLM with
VLLM_ENABLE_V1_MULTIPROCESSING=0, as the GPU harness runs it) adds the load format ``dcu_scaled_dummy``; pass
``load_format="dcu_scaled_dummy", model_loader_extra_config=Scales(...).to_dict()``. The scales' arithmetic
(``std_rule``) is shared with the CPU simulation in bench/equiv_sim.py. Standard library at import; torch when
a model is re-initialised.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, fields

LOAD_FORMAT = "dcu_scaled_dummy"

# module classes (by name, so CPU tests can use stand-ins) and how their "weight" is applied
NORM_ONE_PLUS = ("GemmaRMSNorm",)  # y = x / rms * (1 + w)
NORM_DIRECT = ("RMSNorm", "RMSNormGated")  # y = x / rms * w
EMBEDDINGS = ("VocabParallelEmbedding",)
LM_HEADS = ("ParallelLMHead",)
QK_NORM_NAMES = ("q_norm", "k_norm")
KEEP_PARAMS = ("q_scale", "k_scale", "v_scale", "prob_scale")


@dataclass(frozen=True)
class Scales:
    seed: int = 0
    embed_std: float = 1.0
    linear_gain: float = 1.0
    score_std: float = 3.0
    logit_std: float = 3.0
    conv_gain: float = 1.0
    a_log: float = 0.0
    dt_bias: float = -3.0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "seed":
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"Scales.seed must be an int >= 0, got {v!r}")
            elif not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"Scales.{f.name} must be a finite number, got {v!r}")
            elif f.name in ("embed_std", "linear_gain", "score_std", "logit_std", "conv_gain") and v <= 0:
                raise ValueError(f"Scales.{f.name} must be > 0, got {v!r}")

    @property
    def qk_norm_gain(self) -> float:
        """Gain of q_norm and k_norm: scores of unit-RMS q, k times it each have std gain^2 = score_std."""
        return math.sqrt(self.score_std)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Scales":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown scale(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def param_seed(seed: int, name: str) -> int:
    """Seed of one parameter's generator: stable across processes (not Python's randomized hash)."""
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def std_rule(module_cls: str, module_path: str, param_name: str, shape: tuple, scales: Scales):
    """How one parameter is set: ("normal", std), ("const", value) or ("keep", None) (the KV-cache quantization
    scales an attention layer of a quantized checkpoint carries: their -1 default means 'not loaded'; a vision
    tower, should one be built: the harness's language_model_only leaves none). Raises
    ValueError for a parameter no rule covers. module_path is the module's dotted name in the model (its last part
    tells q_norm / k_norm apart)."""
    leaf = module_path.rsplit(".", 1)[-1]
    where = f"{module_path}.{param_name} ({module_cls}, shape {tuple(shape)})"
    if param_name in KEEP_PARAMS or "visual" in module_path.split("."):
        return "keep", None  # a vision tower (text-only prompts never run it) is left as built
    if param_name == "A_log":
        return "const", scales.a_log
    if param_name == "dt_bias":
        return "const", scales.dt_bias
    if param_name == "bias":
        return "const", 0.0
    if param_name != "weight":
        raise ValueError(f"no re-initialisation rule for {where}")
    gain = scales.qk_norm_gain if leaf in QK_NORM_NAMES else 1.0
    if module_cls in NORM_ONE_PLUS:
        return "const", gain - 1.0
    if module_cls in NORM_DIRECT:
        return "const", gain
    if module_cls in LM_HEADS:
        return "normal", scales.logit_std / math.sqrt(shape[-1])
    if module_cls in EMBEDDINGS:
        return "normal", scales.embed_std
    if module_cls.endswith("Linear"):
        if len(shape) == 2:
            return "normal", scales.linear_gain / math.sqrt(shape[1])
        if len(shape) == 3 and shape[1] == 1:  # depthwise conv1d [channels, 1, kernel]
            return "normal", scales.conv_gain / math.sqrt(shape[2])
    raise ValueError(f"no re-initialisation rule for {where}")


def plan(model, scales: Scales) -> list[tuple[str, str, float | None]]:
    """(parameter name, "normal" | "const" | "keep", std or value) for every parameter of ``model``, in module
    order; raises before anything is written if one has no rule."""
    out = []
    for path, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            kind, val = std_rule(type(module).__name__, path, pname, tuple(p.shape), scales)
            out.append((f"{path}.{pname}" if path else pname, kind, val))
    return out


def reinit_(model, scales: Scales) -> dict:
    """Re-initialise every parameter of ``model`` in place per ``plan``; returns counts and the std per rule."""
    import torch

    params = dict(model.named_parameters())
    summary: dict = {"normal": 0, "const": 0, "keep": 0, "elements": 0}
    with torch.no_grad():
        for name, kind, val in plan(model, scales):
            p = params[name]
            if kind == "keep":
                summary["keep"] += 1
                continue
            if kind == "const":
                p.fill_(val)
            else:
                g = torch.Generator(device=p.device)
                g.manual_seed(param_seed(scales.seed, name))
                p.normal_(0.0, val, generator=g)
            summary[kind] += 1
            summary["elements"] += p.numel()
    return summary


def register_loader() -> str:
    """Register the ``dcu_scaled_dummy`` load format with vLLM (in this process) and return its name."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class ScaledDummyLoader(BaseModelLoader):
        """vLLM's model, weights from ci/gpu/scaled_weights.py (Scales from model_loader_extra_config)."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self.scales = Scales.from_dict(load_config.model_loader_extra_config)

        def download_model(self, model_config) -> None:
            pass

        def load_weights(self, model, model_config) -> None:
            summary = reinit_(model, self.scales)
            print(f"scaled-dummy weights: {summary['normal']} drawn + {summary['const']} constant parameters, "
                  f"{summary['elements']} elements, {self.scales.to_dict()}", flush=True)

    register_model_loader(LOAD_FORMAT)(ScaledDummyLoader)
    return LOAD_FORMAT

"""The step-time model of the vllm-dcu scheduler budget (patch 0004).

Step time (milliseconds), linear in six features of the batch, refitted each step by exponentially forgetting
least squares with non-negative slopes:

    t = c0 + c1 * tokens + c2 * requests + c3 * kv_read_by_decodes + c4 * prefill_attention_pairs + c5 * has_prefill

The last three carry what a batch's size alone does not: a decode reads its whole KV cache (memory bound), a
prefill chunk of n tokens at position p does n * (p + n / 2) query-key products (compute bound), and a step with
prefill pays a fixed launch cost that a decode-only step (a replayed full CUDA graph) does not.
Pure Python: no vLLM import.
"""
from __future__ import annotations

import math


# Feature scales: every feature is near 1 for a busy step, so the ridge term means the same on each axis.
# The last feature is 1 for a step that carries prefill work: such a step does not replay a full CUDA graph (vLLM
# captures those for decode-only batches), so it pays a fixed launch cost that a decode-only step does not.
FEATURE_SCALES = (1.0, 1024.0, 64.0, float(1 << 20), float(1 << 26), 1.0)
_N = len(FEATURE_SCALES)


def step_features(tokens: float, requests: float, kv_read: float, prefill_pairs: float,
                  has_prefill: bool | None = None) -> tuple[float, ...]:
    if has_prefill is None:
        has_prefill = prefill_pairs > 0
    s = FEATURE_SCALES
    return (1.0, tokens / s[1], requests / s[2], kv_read / s[3], prefill_pairs / s[4], 1.0 if has_prefill else 0.0)


def solve_spd(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve a small symmetric positive definite system (Cholesky); plain Python beats numpy at this size (6x6)."""
    n = len(b)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            acc = a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            low[i][j] = math.sqrt(max(acc, 1e-12)) if i == j else acc / low[j][j]
    y = [0.0] * n
    for i in range(n):
        y[i] = (b[i] - sum(low[i][k] * y[k] for k in range(i))) / low[i][i]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - sum(low[k][i] * x[k] for k in range(i + 1, n))) / low[i][i]
    return x


class StepTimeModel:
    """Exponentially forgetting least squares of step time (ms) on ``step_features``; slopes are kept >= 0 so
    the prediction never falls as a batch grows."""

    def __init__(self, forget: float = 0.98, ridge: float = 1e-3) -> None:
        self.forget = forget
        self.ridge = ridge
        self._gram = [[0.0] * _N for _ in range(_N)]
        self._rhs = [0.0] * _N
        self.coef = [0.0] * _N
        self.num_samples = 0
        self.resid_var = 0.0

    def predict(self, x: tuple[float, ...]) -> float:
        return sum(c * v for c, v in zip(self.coef, x))

    @property
    def resid_std(self) -> float:
        return math.sqrt(self.resid_var)

    def observe(self, x: tuple[float, ...], t_ms: float, outlier_ms: float) -> None:
        if self.num_samples >= 8:
            pred = self.predict(x)
            resid = t_ms - pred
            # Huber-style clip: one stalled step (a JIT compile, a page fault storm) must not wreck the fit.
            limit = max(4.0 * self.resid_std, outlier_ms)
            if resid > limit:
                t_ms = pred + limit
                resid = limit
            self.resid_var = self.forget * self.resid_var + (1.0 - self.forget) * resid * resid
        lam = self.forget
        for i in range(_N):
            row = self._gram[i]
            for j in range(_N):
                row[j] = lam * row[j] + x[i] * x[j]
            self._rhs[i] = lam * self._rhs[i] + t_ms * x[i]
        self.num_samples += 1
        self.coef = self._solve()

    def _solve(self) -> list[float]:
        active = list(range(_N))
        while True:
            gram = [[self._gram[i][j] + (self.ridge if i == j and i else 0.0) for j in active] for i in active]
            sol = solve_spd(gram, [self._rhs[i] for i in active])
            coef = [0.0] * _N
            for i, v in zip(active, sol):
                coef[i] = v
            negative = [(coef[i], i) for i in active if i and coef[i] < 0.0]
            if not negative:
                return coef
            active.remove(min(negative)[1])  # drop the most negative slope, refit the rest

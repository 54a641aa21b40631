"""A fake `vllm serve` for CPU tests of bench/serve_robustness.py (see fake_robust/harness.py for the modes).

It answers like vLLM with patch 0008: a request equal to a case of bench/bad_requests.py gets the answer the case
expects (a stream's refusal as its first event); anything else is a normal request, answered with max_tokens tokens
(a stream: one event per token, a usage event, [DONE]) while its prompt + max_tokens count as KV in use. /metrics
publishes vllm:kv_cache_usage_perc, vllm:num_requests_running / waiting, vllm:num_preemptions_total and
vllm:request_success_total by finished_reason, as vLLM 0.18.1 names them.
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench import bad_requests  # the repository is on PYTHONPATH (fake_robust/harness.py's variant_env)

MODE = os.environ.get("FAKE_ROBUST_MODE", "ok")
KV_TOKENS = int(os.environ.get("FAKE_KV_TOKENS", "600"))
TOKEN_S = float(os.environ.get("FAKE_TOKEN_S", "0.002"))


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.held = {}  # request number -> KV tokens
        self.leaked = 0
        self.next = 0
        self.preemptions = 0
        self.finished = {"length": 0, "abort": 0}

    def admit(self, tokens):
        with self.lock:
            self.next += 1
            if sum(self.held.values()) + tokens > KV_TOKENS:
                self.preemptions += 1
            self.held[self.next] = tokens
            return self.next

    def release(self, n, reason):
        with self.lock:
            tokens = self.held.pop(n, 0)
            if reason == "abort" and MODE == "leak":
                self.leaked += tokens
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def metrics(self):
        with self.lock:
            used = sum(self.held.values()) + self.leaked
            running = len(self.held)
            lab = '{engine="0",model_name="Qwen3.5-27B"}'
            lines = [f"vllm:kv_cache_usage_perc{lab} {min(1.0, used / KV_TOKENS)}",
                     f"vllm:num_requests_running{lab} {float(min(running, 128))}",
                     f"vllm:num_requests_waiting{lab} {float(max(0, running - 128))}",
                     f"vllm:num_preemptions_total{lab} {float(self.preemptions)}"]
            for reason, n in self.finished.items():
                lines.append(f'vllm:request_success_total{{engine="0",finished_reason="{reason}",'
                             f'model_name="Qwen3.5-27B"}} {float(n)}')
            return ("# TYPE vllm:kv_cache_usage_perc gauge\n" + "\n".join(lines) + "\n").encode()


def serve(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--max-model-len", type=int, required=True)
    ap.add_argument("--attention-backend", action="append", default=[])
    a, rest = ap.parse_known_args(argv)
    print("INFO fake vllm serve " + " ".join(argv), flush=True)
    if os.environ.get("FAKE_INPROCESS") == "1":
        print("ValueError: vllm serve was given an in-process engine environment", flush=True)
        sys.exit(6)
    if MODE == "crash":
        print("RuntimeError: fake start failure", flush=True)
        sys.exit(3)
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--reasoning-parser", "--load-format",
                 "--kv-cache-memory-bytes"):
        if flag not in rest:
            print(f"missing {flag}", flush=True)
            sys.exit(4)
    if a.attention_backend[-1:] != ["DCU_TRITON_ATTN"]:
        print(f"attention backend {a.attention_backend}: expected DCU_TRITON_ATTN last", flush=True)
        sys.exit(5)
    tokenizer = os.path.exists(os.path.join(a.model, "tokenizer.json"))
    with open(os.path.join(a.model, "config.json")) as f:
        vocab = json.load(f)["text_config"]["vocab_size"]
    served = a.served_model_name or a.model
    cases = {c.payload(): c for c in bad_requests.catalogue(served, vocab, a.max_model_len, tokenizer=tokenizer)}
    state = State()
    print("INFO Available KV cache memory: 0.44 GiB", flush=True)
    print(f"INFO GPU KV cache size: {KV_TOKENS:,} tokens", flush=True)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._json(200, {})
            if self.path == "/metrics":
                data = state.metrics()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if self.path == "/v1/models":
                return self._json(200, {"data": [{"id": served, "max_model_len": a.max_model_len}]})
            self._json(404, {"error": {"message": "not found", "code": 404}})

        def _error(self, case, status=None):
            err = {"message": f"fake refusal of {case.kind}: {case.expect_text or ''}", "type": "BadRequestError",
                   "param": case.expect_param, "code": status or case.expect_status}
            return {"error": err}

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            case = cases.get(raw)
            if case is not None:
                if MODE == "die-on-stop-id" and case.kind == "stop-id-min-tokens":
                    print("ERROR EngineCore encountered a fatal error: device-side assert triggered", flush=True)
                    os._exit(1)
                if case.stream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self.wfile.write(f"data: {json.dumps(self._error(case))}\n\ndata: [DONE]\n\n".encode())
                    return
                return self._json(case.expect_status, self._error(case))
            try:
                body = json.loads(raw)
            except ValueError:
                return self._json(400, {"error": {"message": "JSON decode error", "code": 400}})
            if body.get("model") != served:
                return self._json(404, {"error": {"message": "no such model", "code": 404}})
            out = int(body.get("max_tokens") or 16)
            prompt = body.get("prompt") or body.get("token_ids") or []
            plen = len(prompt) if isinstance(prompt, list) else 8
            n = state.admit(plen + out)
            usage = {"prompt_tokens": plen, "completion_tokens": out, "total_tokens": plen + out}
            if not body.get("stream"):
                time.sleep(TOKEN_S * out)
                state.release(n, "length")
                return self._json(200, {"choices": [{"index": 0, "text": "w" * out, "finish_reason": "length"}],
                                        "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for i in range(out):
                    time.sleep(TOKEN_S)
                    chunk = {"choices": [{"index": 0, "text": "w", "finish_reason": None}], "usage": None}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                state.release(n, "length")
            except (BrokenPipeError, ConnectionResetError):
                state.release(n, "abort")

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((a.host, a.port), H).serve_forever()


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        serve(argv[1:])
    else:
        sys.exit(f"fake vllm: unsupported {argv[:2]}")


if __name__ == "__main__":
    main()

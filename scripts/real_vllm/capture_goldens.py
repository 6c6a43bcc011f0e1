"""Capture golden responses from a running real vLLM engine for the simulator's fidelity test.

    python scripts/real_vllm/capture_goldens.py [--out tests/golden/vllm-0.32] [--engine 0]

Reads the tier's state file (see engines.py) and talks to ONE engine only, so the timings
are not distorted by a second busy engine on the same cores. Writes, into --out:

  models.json, version.json      GET /v1/models, GET /version
  openapi.json                   GET /openapi.json: every route the engine serves
  tokenize.json                  POST /tokenize
  completion.json                POST /v1/completions (return_token_ids)
  completion_stream.txt          the same, streamed with usage: raw SSE bytes
  chat.json                      POST /v1/chat/completions (return_token_ids)
  chat_stream.txt                streamed chat with include_usage + return_token_ids: raw SSE bytes
  error_prompt_too_long.json     400 for a prompt over --max-model-len
  error_unknown_model.json       404 for a model the server does not serve
  error_pooling_route.json       404 for /v1/embeddings, which a generation engine lacks
  metrics.txt                    GET /metrics after the requests above, incl. prefix-cache hits
  timings.json                   TTFT and per-output-token seconds by prompt length
  manifest.json                  for each file: the request that produced it, status, headers

With --pd (the prefill/decode pair of `engines.py start --pd-nixl`), instead:

  pd_prefill.json                prefill leg answer: kv_transfer_params for the decode engine
  pd_decode.json                 decode leg answer (original body + those kv_transfer_params)
  pd_prefill_for_stream.json     a second exchange, prefill leg,
  pd_decode_stream.txt           and its decode leg streamed: raw SSE bytes
  pd_prefill_metrics.txt         /metrics of both engines afterwards (vllm:nixl_* on decode)
  pd_decode_metrics.txt
  pd_manifest.json               requests, statuses and headers, as manifest.json

With --pooling (an engine of `engines.py start --count 1 --pooling`: the model as an
embedding model), instead:

  openapi_pooling.json           GET /openapi.json: the pooling engine's routes
  pooling_models.json            GET /v1/models
  embeddings.json                POST /v1/embeddings (two inputs)
  embeddings_base64.json         the same with encoding_format base64
  pooling.json                   POST /pooling
  score.json                     POST /score (one text_1, two text_2)
  rerank.json                    POST /v1/rerank (top_n 2 of 3 documents)
  rerank_v2.json                 POST /v2/rerank
  error_classify_route.json      404 for /classify, which an embedding engine lacks
  error_generation_route.json    404 for /v1/completions on a pooling engine
  pooling_manifest.json          requests, statuses and headers, as manifest.json

With --pooling classify (an engine of `engines.py start --count 1 --pooling classify`: the
model as a two-label classifier), instead:

  openapi_classify.json          GET /openapi.json: the classifying engine's routes
  classify.json                  POST /classify (two inputs)
  classify_pooling.json          POST /pooling on that engine
  classify_manifest.json         requests, statuses and headers, as manifest.json

Uses only the standard library plus httpx (in the project venv).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

CACHE = Path.home() / ".cache" / "fleet-proxy"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run by the vLLM venv's python, which lacks this project
from proxy.backends.kv_transfer import remote_decode_params  # noqa: E402

KEPT_HEADERS = ("content-type", "x-request-id", "server", "transfer-encoding")


class Capture:
    def __init__(self, base: str, out: Path, model: str) -> None:
        self.client = httpx.Client(base_url=base, timeout=httpx.Timeout(300.0))
        self.out = out
        self.model = model
        self.manifest: dict[str, Any] = {}

    def _record(self, name: str, method: str, path: str, body: Any, resp: httpx.Response) -> None:
        self.manifest[name] = {
            "method": method,
            "path": path,
            "request": body,
            "status": resp.status_code,
            "headers": {k: v for k, v in resp.headers.items() if k.lower() in KEPT_HEADERS},
        }

    def json_call(self, name: str, method: str, path: str, body: Any = None) -> Any:
        resp = self.client.request(method, path, json=body)
        self._record(name, method, path, body, resp)
        data = resp.json()
        (self.out / name).write_text(json.dumps(data, indent=2) + "\n")
        return data

    def raw_stream(self, name: str, path: str, body: Any) -> bytes:
        chunks = []
        with self.client.stream("POST", path, json=body) as resp:
            for chunk in resp.iter_raw():
                chunks.append(chunk)
            self._record(name, "POST", path, body, resp)
        raw = b"".join(chunks)
        (self.out / name).write_bytes(raw)
        return raw

    def text_get(self, name: str, path: str) -> str:
        resp = self.client.get(path)
        self._record(name, "GET", path, None, resp)
        (self.out / name).write_text(resp.text)
        return resp.text


def unique_prompt_ids(rng: random.Random, length: int, vocab: int) -> list[int]:
    """Random token ids: no two timing prompts share a prefix block, so no cache hits."""
    return [rng.randrange(16, vocab) for _ in range(length)]


def timed_stream(
    client: httpx.Client, model: str, prompt: list[int], max_tokens: int
) -> dict[str, float]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    sent = time.perf_counter()
    first: float | None = None
    arrivals: list[float] = []
    with client.stream("POST", "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            choices = event.get("choices") or []
            if choices and choices[0].get("token_ids"):
                now = time.perf_counter()
                arrivals.extend([now] * len(choices[0]["token_ids"]))
                first = first if first is not None else now
    done = time.perf_counter()
    if first is None or len(arrivals) < 2:
        raise RuntimeError(f"stream produced {len(arrivals)} tokens; expected {max_tokens}")
    return {
        "ttft_s": first - sent,
        "tpot_s": (done - first) / (len(arrivals) - 1),
        "e2e_s": done - sent,
        "output_tokens": float(len(arrivals)),
    }


def capture_timings(
    cap: Capture, vocab: int, lengths: list[int], reps: int, max_tokens: int, omp_threads: int
) -> dict[str, Any]:
    rng = random.Random(7)
    timed_stream(cap.client, cap.model, unique_prompt_ids(rng, 32, vocab), 4)  # warm-up
    rows = []
    for length in lengths:
        samples = [
            timed_stream(cap.client, cap.model, unique_prompt_ids(rng, length, vocab), max_tokens)
            for _ in range(reps)
        ]
        rows.append(
            {
                "prompt_tokens": length,
                "output_tokens": max_tokens,
                "ttft_s": [s["ttft_s"] for s in samples],
                "tpot_s": [s["tpot_s"] for s in samples],
                "e2e_s": [s["e2e_s"] for s in samples],
                "ttft_s_median": statistics.median(s["ttft_s"] for s in samples),
                "tpot_s_median": statistics.median(s["tpot_s"] for s in samples),
            }
        )
        print(
            f"[capture] prompt={length} ttft={rows[-1]['ttft_s_median']:.4f}s "
            f"tpot={rows[-1]['tpot_s_median']:.4f}s",
            file=sys.stderr,
        )
    # A prompt whose prefix is cached: the same long prompt twice, the second time timed.
    shared = unique_prompt_ids(rng, 1024, vocab)
    timed_stream(cap.client, cap.model, shared, 2)
    hit = [
        timed_stream(
            cap.client, cap.model, [*shared, *unique_prompt_ids(rng, 16, vocab)], max_tokens
        )
        for _ in range(reps)
    ]
    return {
        "method": "streamed /v1/completions with token-id prompts, greedy, ignore_eos; "
        "one engine busy, any other idle; TTFT = send to first chunk with tokens; "
        "TPOT = (E2E - TTFT) / (tokens - 1)",
        "engine_args": "--enforce-eager --dtype float32 --enable-prefix-caching "
        "--max-model-len 4096",
        "model": f"tiny Llama: hidden 256, 4 layers, float32, vocab {vocab}",
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_end": os.getloadavg()[0]},
        "omp_threads_per_engine": omp_threads,
        "by_prompt_length": rows,
        "prefix_hit_1024_plus_16": {
            "ttft_s": [s["ttft_s"] for s in hit],
            "tpot_s": [s["tpot_s"] for s in hit],
            "ttft_s_median": statistics.median(s["ttft_s"] for s in hit),
        },
    }


def capture_all(
    cap: Capture, max_model_len: int, vocab: int, lengths: list[int], reps: int, omp_threads: int
) -> None:
    m = cap.model
    cap.json_call("models.json", "GET", "/v1/models")
    cap.json_call("version.json", "GET", "/version")
    cap.json_call("openapi.json", "GET", "/openapi.json")
    cap.json_call(
        "tokenize.json",
        "POST",
        "/tokenize",
        {"model": m, "prompt": "Hello world, tell me a story."},
    )
    completion = {
        "model": m,
        "prompt": "The router sends the request to",
        "max_tokens": 12,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    cap.json_call("completion.json", "POST", "/v1/completions", completion)
    cap.raw_stream(
        "completion_stream.txt",
        "/v1/completions",
        {**completion, "stream": True, "stream_options": {"include_usage": True}},
    )
    chat = {
        "model": m,
        "messages": [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Tell me about the river."},
        ],
        "max_tokens": 12,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    cap.json_call("chat.json", "POST", "/v1/chat/completions", chat)
    cap.raw_stream(
        "chat_stream.txt",
        "/v1/chat/completions",
        {**chat, "stream": True, "stream_options": {"include_usage": True}},
    )
    too_long = {"model": m, "prompt": [20] * (max_model_len + 1), "max_tokens": 4}
    cap.json_call("error_prompt_too_long.json", "POST", "/v1/completions", too_long)
    cap.json_call(
        "error_unknown_model.json",
        "POST",
        "/v1/completions",
        {**completion, "model": "no-such-model"},
    )
    cap.json_call(
        "error_pooling_route.json", "POST", "/v1/embeddings", {"model": m, "input": "hello"}
    )
    # Prefix hits before the metrics snapshot: a 600-token prompt, then two that extend it.
    rng = random.Random(3)
    prefix = unique_prompt_ids(rng, 600, vocab)
    for tail in range(3):
        cap.client.post(
            "/v1/completions", json={"model": m, "prompt": [*prefix, 30 + tail], "max_tokens": 4}
        ).raise_for_status()
    cap.text_get("metrics.txt", "/metrics")
    timings = capture_timings(cap, vocab, lengths, reps, 32, omp_threads)
    (cap.out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    (cap.out / "manifest.json").write_text(json.dumps(cap.manifest, indent=2) + "\n")


REMOTE_DECODE = remote_decode_params()


def capture_pooling(cap: Capture) -> None:
    """The pooling routes' answers, from an engine running the model as an embedding model."""
    m = cap.model
    cap.json_call("openapi_pooling.json", "GET", "/openapi.json")
    cap.json_call("pooling_models.json", "GET", "/v1/models")
    embed = {"model": m, "input": ["hello world", "the river runs"]}
    cap.json_call("embeddings.json", "POST", "/v1/embeddings", embed)
    cap.json_call(
        "embeddings_base64.json", "POST", "/v1/embeddings", {**embed, "encoding_format": "base64"}
    )
    cap.json_call("pooling.json", "POST", "/pooling", {"model": m, "input": "hello world"})
    score = {"model": m, "text_1": "a cat sat", "text_2": ["a dog sat", "a car drove"]}
    cap.json_call("score.json", "POST", "/score", score)
    rerank = {
        "model": m,
        "query": "a cat sat",
        "documents": ["a dog sat", "a car drove", "the cat sat down"],
        "top_n": 2,
    }
    cap.json_call("rerank.json", "POST", "/v1/rerank", rerank)
    cap.json_call("rerank_v2.json", "POST", "/v2/rerank", rerank)
    cap.json_call("error_classify_route.json", "POST", "/classify", {"model": m, "input": "x"})
    cap.json_call(
        "error_generation_route.json",
        "POST",
        "/v1/completions",
        {"model": m, "prompt": "x", "max_tokens": 2},
    )
    (cap.out / "pooling_manifest.json").write_text(json.dumps(cap.manifest, indent=2) + "\n")


def capture_classify(cap: Capture) -> None:
    """The routes of an engine running the model as a classifier."""
    m = cap.model
    cap.json_call("openapi_classify.json", "GET", "/openapi.json")
    cap.json_call(
        "classify.json", "POST", "/classify", {"model": m, "input": ["hello world", "goodbye"]}
    )
    cap.json_call("classify_pooling.json", "POST", "/pooling", {"model": m, "input": "hello"})
    (cap.out / "classify_manifest.json").write_text(json.dumps(cap.manifest, indent=2) + "\n")


def capture_pd(prefill: Capture, decode: Capture, vocab: int) -> None:
    """The two-step NixlConnector protocol (prefill leg, then decode leg), each leg recorded
    as the engines answered."""
    rng = random.Random(5)
    for stream in (False, True):
        body: dict[str, Any] = {
            "model": prefill.model,
            "prompt": unique_prompt_ids(rng, 300, vocab),
            "max_tokens": 12,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        first = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": REMOTE_DECODE}
        name = "pd_prefill.json" if not stream else "pd_prefill_for_stream.json"
        params = prefill.json_call(name, "POST", "/v1/completions", first)["kv_transfer_params"]
        second = {**body, "kv_transfer_params": params}
        if stream:
            second |= {"stream": True, "stream_options": {"include_usage": True}}
            decode.raw_stream("pd_decode_stream.txt", "/v1/completions", second)
        else:
            decode.json_call("pd_decode.json", "POST", "/v1/completions", second)
    prefill.text_get("pd_prefill_metrics.txt", "/metrics")
    decode.text_get("pd_decode_metrics.txt", "/metrics")
    manifest = {**prefill.manifest, **{f"{k} (decode)": v for k, v in decode.manifest.items()}}
    (prefill.out / "pd_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "vllm-0.32")
    parser.add_argument(
        "--engine", type=int, default=0, help="index of the engine in the state file"
    )
    parser.add_argument("--lengths", default="16,128,512,1024,2048")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pd", action="store_true", help="capture the P/D pair instead")
    parser.add_argument(
        "--pooling",
        nargs="?",
        const="embed",
        choices=("embed", "classify"),
        help="capture a pooling engine's answers instead (embed, the default, or classify)",
    )
    parser.add_argument("--state", type=Path, help="tier state file (default: by mode)")
    args = parser.parse_args(argv)
    if args.state is None:
        env, name = (
            ("FLEET_VLLM_PD_STATE", "pd-state.json")
            if args.pd
            else ("FLEET_VLLM_STATE", "state.json")
        )
        args.state = Path(os.environ.get(env, CACHE / "real-vllm" / name))
    if not args.state.exists():
        print(
            f"[capture] ERROR: no tier state at {args.state}: "
            "start engines with scripts/real_vllm/engines.py start",
            file=sys.stderr,
        )
        return 1
    state = json.loads(args.state.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = int(json.loads((Path(state["model_dir"]) / "config.json").read_text())["vocab_size"])
    if args.pd:
        by_role = {e["role"]: e for e in state["engines"]}
        model = state["served_model_name"]
        prefill = Capture(by_role["prefill"]["url"], args.out, model)
        decode = Capture(by_role["decode"]["url"], args.out, model)
        capture_pd(prefill, decode, vocab)
        print(f"[capture] P/D goldens written to {args.out}", file=sys.stderr)
        return 0
    engine = state["engines"][args.engine]
    cap = Capture(engine["url"], args.out, state["served_model_name"])
    if args.pooling is not None:
        (capture_classify if args.pooling == "classify" else capture_pooling)(cap)
        print(f"[capture] pooling goldens written to {args.out}", file=sys.stderr)
        return 0
    capture_all(
        cap,
        int(state["max_model_len"]),
        vocab,
        [int(x) for x in args.lengths.split(",")],
        args.reps,
        int(state.get("omp_threads", 1)),
    )
    print(f"[capture] goldens written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

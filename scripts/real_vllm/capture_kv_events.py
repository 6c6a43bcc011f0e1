"""Capture a real vLLM engine's KV-cache events as golden files.

    python scripts/real_vllm/capture_kv_events.py [--out tests/golden/vllm-0.32/kv-events]

Needs pyzmq, msgspec, httpx and prometheus_client (the vLLM venv has them all;
refresh_goldens.sh runs it there). Starts ONE engine of its own (its own state file, so it
can run beside the tier) with KV-cache events on (`engines.py start --kv-events`), a
16-block KV cache and --max-model-len 1024, so that a few requests evict cached blocks, and
stops it at the end. A ZMQ SUB socket connected to the engine's publisher records every
message while known token-id prompts go in:

  store                    a prompt of 2 full blocks + 10 tokens
  aligned, aligned_repeat  a prompt of exactly 2 blocks, twice: the repeat hits only the
                           first block (vLLM always computes the last prompt token) and
                           stores a second copy of the other, reported again
  decode_fills_a_block     1 block + 100 tokens, 60 greedy tokens: the second block is
                           filled by generated tokens, in a later step than the first
  shared_prefix            the first block of `store`'s prompt + 200 new tokens
  repeat_full_report       `store`'s prompt again with vllm_xargs kv_cache_report_mode=full
                           (vLLM then re-reports the blocks it reused)
  fill, evict              two unrelated 900-token prompts: the 16 blocks overflow and older
                           cached blocks are evicted (BlockRemoved)
  repeat_after_eviction    `store`'s prompt again
  reset                    POST /reset_prefix_cache (the engine runs with
                           VLLM_SERVER_DEV_MODE=1); vLLM publishes AllBlocksCleared only
                           with the next step's batch
  after_reset              the shared-prefix prompt again

Then one replay exchange on the ROUTER socket (a DEALER asks from sequence number 2). Writes,
into --out:

  pub-NNN-{topic,seq,payload}.bin   the three raw frames of published message NNN (= its seq)
  replay-request-{0,1}.bin          the replay request as sent (empty delimiter, start seq)
  replay-MMM-{0,1,2,3}.bin          each reply message as received by the DEALER (delimiter,
                                    topic, seq, payload); the last one is the END marker
  decoded.json                      every message's payload decoded (msgspec, untyped)
  manifest.json                     the engine configuration, each step's request, answer
                                    and /metrics prefix-cache deltas, and for each message
                                    its seq, files, step and a summary of its events

Messages the subscriber missed (the ZMQ slow-joiner effect: a PUB socket drops what it
publishes before a new subscriber's subscription reaches it) are taken from the replay buffer
and marked `"source": "replay"`; every message the subscriber did receive is checked to be
byte-identical to the replayed one.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import zmq
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import engines  # noqa: E402  (standard library only; beside this script)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
NUM_GPU_BLOCKS = 16
MAX_MODEL_LEN = 1024
REPLAY_FROM = 2


class Capture:
    def __init__(self, engine: engines.Engine, topic: str, out: Path) -> None:
        assert engine.kv_events_endpoint and engine.kv_events_replay_endpoint
        self.engine = engine
        self.topic = topic.encode()
        self.out = out
        self.client = httpx.Client(base_url=engine.url, timeout=httpx.Timeout(300.0))
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.connect(engine.kv_events_endpoint)
        self.received: dict[int, list[bytes]] = {}
        self.step_of: dict[int, str] = {}
        self.steps: list[dict[str, Any]] = []

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        text = self.client.get("/metrics").text
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def metrics(self) -> dict[str, float]:
        wanted = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
        return {name: value for name, _, value in self.samples() if name in wanted}

    def cache_config(self) -> dict[str, str]:
        for name, labels, _ in self.samples():
            if name == "vllm:cache_config_info":
                return labels
        raise RuntimeError("no vllm:cache_config_info in /metrics")

    def drain(self, quiet: float = 1.5, limit: float = 60.0) -> list[int]:
        """Messages until none came for `quiet` seconds (the step's events are published
        before its answer returns; this only waits for the publisher thread)."""
        seqs = []
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.sub.poll(int(quiet * 1000)):
            frames = self.sub.recv_multipart()
            seq = int.from_bytes(frames[1], "big")
            self.received[seq] = frames
            seqs.append(seq)
        return seqs

    def step(self, name: str, what: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        before = self.metrics()
        resp = self.client.post(path, json=body) if body is not None else self.client.post(path)
        resp.raise_for_status()
        seqs = self.drain()
        after = self.metrics()
        for seq in seqs:
            self.step_of[seq] = name
        answer = resp.json()
        if "choices" in answer:
            choice = answer["choices"][0]
            answer = {
                "usage": answer["usage"],
                "token_ids": choice.get("token_ids"),
                "finish_reason": choice.get("finish_reason"),
            }
        record = {
            "name": name,
            "what": what,
            "request": {"method": "POST", "path": path, "body": body},
            "status": resp.status_code,
            "answer": answer,
            "metrics_delta": {
                "prefix_cache_hits": after["vllm:prefix_cache_hits_total"]
                - before["vllm:prefix_cache_hits_total"],
                "prefix_cache_queries": after["vllm:prefix_cache_queries_total"]
                - before["vllm:prefix_cache_queries_total"],
            },
            "seqs_received": seqs,
        }
        self.steps.append(record)
        print(f"[kv-capture] {name}: seqs {seqs}, {record['metrics_delta']}", file=sys.stderr)
        return record

    def replay(self, start_seq: int) -> tuple[list[bytes], list[list[bytes]]]:
        assert self.engine.kv_events_replay_endpoint
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.engine.kv_events_replay_endpoint)
        request = [b"", start_seq.to_bytes(8, "big")]
        dealer.send_multipart(request)
        replies = []
        while dealer.poll(10_000):
            frames = dealer.recv_multipart()
            replies.append(frames)
            if frames[2] == END_SEQ:
                break
        else:
            raise RuntimeError(f"replay from {start_seq}: no END marker after {len(replies)}")
        dealer.close(linger=0)
        return request, replies


def port_of(endpoint: str | None) -> int:
    assert endpoint is not None
    return int(endpoint.rsplit(":", 1)[1])


def dumps(data: Any) -> str:
    """Indented JSON with each list of numbers on one line (token ids, block hashes)."""
    text = json.dumps(data, indent=1)
    return re.sub(r"\[([^\[\]{}\"]*)\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def summary(event: dict[str, Any]) -> dict[str, Any]:
    if event["type"] == "BlockStored":
        return {
            "type": "BlockStored",
            "blocks": len(event["block_hashes"]),
            "tokens": len(event["token_ids"]),
            "parent_block_hash": event["parent_block_hash"],
            "block_hashes": event["block_hashes"],
        }
    return dict(event)


def capture(state: engines.TierState, out: Path) -> None:
    engine = state.engines[0]
    assert state.kv_events_topic is not None
    cap = Capture(engine, state.kv_events_topic, out)
    config = cap.cache_config()
    block = int(config["block_size"])
    rng = random.Random(32)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 2000) for _ in range(n)]

    p_store = ids(2 * block + 10)
    p_aligned = ids(2 * block)
    p_decode = ids(block + 100)
    p_shared = p_store[:block] + ids(200)
    p_fill, p_evict = ids(900), ids(900)

    def completion(prompt: list[int], max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
        return {
            "model": state.served_model_name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            **extra,
        }

    done = cap.step  # short alias
    done("store", "2 full blocks + 10 tokens", "/v1/completions", completion(p_store))
    done("aligned", "exactly 2 full blocks", "/v1/completions", completion(p_aligned))
    done(
        "aligned_repeat",
        "the same 2 blocks again: 1 block hits, the second is computed and stored again",
        "/v1/completions",
        completion(p_aligned),
    )
    done(
        "decode_fills_a_block",
        "1 full block + 100 tokens, 60 generated: block 2 fills while decoding",
        "/v1/completions",
        completion(p_decode, 60, ignore_eos=True),
    )
    done(
        "shared_prefix",
        "store's first block + 200 new tokens",
        "/v1/completions",
        completion(p_shared),
    )
    done(
        "repeat_full_report",
        "store's prompt again, kv_cache_report_mode=full: reused blocks are re-reported",
        "/v1/completions",
        completion(p_store, vllm_xargs={"kv_cache_report_mode": "full"}),
    )
    done("fill", "an unrelated 900-token prompt", "/v1/completions", completion(p_fill))
    done(
        "evict",
        "another unrelated 900-token prompt: the 16-block cache evicts older blocks",
        "/v1/completions",
        completion(p_evict),
    )
    done("repeat_after_eviction", "store's prompt again", "/v1/completions", completion(p_store))
    reset = done(
        "reset",
        "POST /reset_prefix_cache: AllBlocksCleared waits for the next step's batch",
        "/reset_prefix_cache",
        None,
    )
    assert reset["answer"] == {"success": True}, reset["answer"]
    done(
        "after_reset",
        "the shared-prefix prompt again",
        "/v1/completions",
        completion(p_shared),
    )

    request, replies = cap.replay(REPLAY_FROM)
    # Every message, from the subscriber where it got it, else from the replay buffer (which
    # holds all of them: 10,000 batches); what both have must be byte-identical.
    _, full = cap.replay(0)
    replayed = {int.from_bytes(f[2], "big"): f[1:] for f in full if f[2] != END_SEQ}
    for seq, frames in cap.received.items():
        assert replayed[seq] == frames, f"seq {seq}: the replay differs from the subscriber"
    assert sorted(replayed) == list(range(len(replayed))), sorted(replayed)

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.bin"):
        old.unlink()
    frames_manifest = []
    decoded = []
    for seq in sorted(replayed):
        frames = cap.received.get(seq, replayed[seq])
        files = {}
        for part, data in zip(("topic", "seq", "payload"), frames, strict=True):
            name = f"pub-{seq:03d}-{part}.bin"
            (out / name).write_bytes(data)
            files[part] = name
        batch = msgspec.msgpack.decode(frames[2])
        decoded.append(
            {"seq": seq, "ts": batch[0], "data_parallel_rank": batch[2], "events": batch[1]}
        )
        frames_manifest.append(
            {
                "seq": seq,
                "files": files,
                "source": "subscriber" if seq in cap.received else "replay",
                "step": cap.step_of.get(seq),
                "events": [summary(e) for e in batch[1]],
            }
        )
    request_files = []
    for i, data in enumerate(request):
        name = f"replay-request-{i}.bin"
        (out / name).write_bytes(data)
        request_files.append(name)
    reply_manifest = []
    for m, frames in enumerate(replies):
        names = []
        for i, data in enumerate(frames):
            name = f"replay-{m:03d}-{i}.bin"
            (out / name).write_bytes(data)
            names.append(name)
        reply_manifest.append(
            {"seq": int.from_bytes(frames[2], "big", signed=True), "files": names}
        )

    version = cap.client.get("/version").json()
    kv_ports = (port_of(engine.kv_events_endpoint), port_of(engine.kv_events_replay_endpoint))
    manifest = {
        "vllm_version": version.get("version"),
        "engine": {
            "args": engines.engine_command(
                Path("VENV"),
                Path("tiny-llama"),
                engine.port,
                False,
                kv_ports,
                state.max_model_len,
                state.num_gpu_blocks,
            )[1:],
            "env": "VLLM_SERVER_DEV_MODE=1 (for /reset_prefix_cache), no PYTHONHASHSEED",
            "kv_events_config": json.loads(engines.kv_events_config(*kv_ports)),
            "block_size": block,
            "num_gpu_blocks": int(config["num_gpu_blocks"]),
            "max_model_len": state.max_model_len,
            "enable_prefix_caching": config["enable_prefix_caching"] == "True",
            "prefix_caching_hash_algo": config["prefix_caching_hash_algo"],
            "python_hash_seed": None,
        },
        "wire": {
            "pub": "3 frames: topic (utf-8, as configured), seq (8 bytes, big-endian, from 0 "
            "per engine process), payload (msgpack array [ts, events, data_parallel_rank]; each "
            "event a map with a 'type' key)",
            "replay": "DEALER sends [b'', start seq as 8 bytes big-endian]; the ROUTER answers "
            "[b'', topic, seq, payload] for each buffered message with seq >= start, then "
            "[b'', b'', END, b''] with END = -1 as 8 signed big-endian bytes",
        },
        "steps": cap.steps,
        "frames": frames_manifest,
        "replay": {
            "start_seq": REPLAY_FROM,
            "request_files": request_files,
            "replies": reply_manifest,
        },
    }
    (out / "manifest.json").write_text(dumps(manifest) + "\n")
    (out / "decoded.json").write_text(dumps(decoded) + "\n")
    print(f"[kv-capture] {len(frames_manifest)} messages into {out}", file=sys.stderr)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "tests" / "golden" / "vllm-0.32" / "kv-events"
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=engines.CACHE / "real-vllm" / "kv-capture" / "state.json",
        help="this capture's own engine state file (its log goes to logs/ beside it)",
    )
    args = parser.parse_args(argv)
    options = engines.Options(
        kv_events=True, max_model_len=MAX_MODEL_LEN, num_gpu_blocks=NUM_GPU_BLOCKS
    )
    try:
        state = engines.start(1, False, 420.0, options, path=args.state)
    except engines.TierError as exc:
        print(f"[kv-capture] ERROR: {exc}", file=sys.stderr)
        return 1
    try:
        capture(state, args.out)
    finally:
        for engine in state.engines:
            engines.stop_engine(engine)
        args.state.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

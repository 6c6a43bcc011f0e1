"""The simulator answers like the real vLLM 0.32 captured in tests/golden/vllm-0.32/.

Every captured request (manifest.json) is replayed verbatim against a cpu-tiny simulator
serving the same model name; the answers must have the same status, content type and JSON
shape (keys and value kinds, not values), streams the same chunk shapes and framing, errors
the same messages, and /metrics every vllm: family of the real page with the same type,
label names, enumerated label values and histogram buckets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "vllm-0.32"
NEEDED = ("manifest.json", "metrics.txt", "completion.json", "chat.json", "chat_stream.txt")
MISSING = [name for name in NEEDED if not (GOLDEN / name).exists()]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"golden captures missing in {GOLDEN}: {', '.join(MISSING)}"
)

# Labels whose values are a fixed vocabulary the router may match on.
ENUMERATED = ("reason", "finished_reason", "source", "sleep_state")


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "str"


def sse_chunks(text: str) -> tuple[list[dict[str, Any]], bool]:
    events = [e for e in text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), "every SSE event is a data line"
    done = events[-1] == "data: [DONE]"
    return [json.loads(e[6:]) for e in events if e != "data: [DONE]"], done


def stream_shapes(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The distinct kinds of chunk: opening, a middle one, the finishing one, usage."""
    with_choices = [c for c in chunks if c["choices"]]
    finishing = next(c for c in with_choices if c["choices"][0].get("finish_reason"))
    return {
        "first": shape(chunks[0]),
        "second": shape(with_choices[1]),
        "finishing": shape(finishing),
        "usage": shape(chunks[-1]),
    }


def families(page: str) -> dict[str, tuple[str, set[str], dict[str, set[str]], list[str]]]:
    out = {}
    for fam in text_string_to_metric_families(page):
        if not fam.name.startswith("vllm:") or fam.name.endswith("_created"):
            continue
        labels: set[str] = set()
        values: dict[str, set[str]] = {}
        buckets: list[str] = []
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            for key in ENUMERATED:
                if key in s.labels:
                    values.setdefault(key, set()).add(s.labels[key])
            if s.name.endswith("_bucket") and s.labels.get("le") not in buckets:
                buckets.append(s.labels["le"])
        out[fam.name] = (fam.type, labels, values, buckets)
    return out


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return json.loads((GOLDEN / "manifest.json").read_text())


# Captured for the proxy's route table (tests/unit/proxy/test_route_table.py), not replayed:
# the simulator does not publish an OpenAPI document.
NOT_REPLAYED = frozenset(
    {"metrics.txt", "openapi.json", "openapi_pooling.json", "openapi_classify.json"}
)


async def replay(http: aiohttp.ClientSession, url: str, manifest: dict[str, Any]) -> int:
    """Every captured request against the simulator at `url`; returns how many it replayed."""
    replayed = 0
    for name, entry in manifest.items():
        if name in NOT_REPLAYED or not (GOLDEN / name).exists():
            continue
        async with http.request(entry["method"], url + entry["path"], json=entry["request"]) as r:
            assert r.status == entry["status"], name
            want_type = entry["headers"]["content-type"]
            assert r.headers["Content-Type"] == want_type, name
            body = await r.text()
        golden = (GOLDEN / name).read_text()
        if name.endswith(".txt"):
            got_chunks, got_done = sse_chunks(body)
            want_chunks, want_done = sse_chunks(golden)
            assert got_done and want_done, name
            assert stream_shapes(got_chunks) == stream_shapes(want_chunks), name
        else:
            got, want = orjson.loads(body), json.loads(golden)
            assert shape(got) == shape(want), name
            if "error" in want or "detail" in want:
                assert got == want, name  # vLLM's exact messages
            if name == "version.json":
                assert got == want
        replayed += 1
    return replayed


async def test_replayed_requests_answer_with_the_same_shapes(
    tokenizer: Tokenizer, manifest: dict[str, Any]
) -> None:
    async with (
        await start_fleet(
            1, profile="cpu-tiny", model="tiny", speed=20, tokenizer=tokenizer
        ) as fleet,
        aiohttp.ClientSession() as http,
    ):
        url = fleet.urls[0]
        assert await replay(http, url, manifest) >= 8

        async with http.get(url + "/metrics") as r:
            assert r.headers["Content-Type"] == manifest["metrics.txt"]["headers"]["content-type"]
            page = await r.text()
    real = families((GOLDEN / "metrics.txt").read_text())
    sim = families(page)
    missing = sorted(set(real) - set(sim))
    assert not missing, f"vllm: families the simulator lacks: {missing}"
    for name, (kind, labels, values, buckets) in real.items():
        assert sim[name][0] == kind, name
        assert sim[name][1] == labels, (name, labels ^ sim[name][1])
        assert sim[name][2] == values, name
        assert sim[name][3] == buckets, name


PD_NEEDED = (
    "pd_manifest.json",
    "pd_prefill.json",
    "pd_decode.json",
    "pd_decode_stream.txt",
    "pd_prefill_metrics.txt",
    "pd_decode_metrics.txt",
)
PD_MISSING = [name for name in PD_NEEDED if not (GOLDEN / name).exists()]


def _family_differences(real_page: str, sim_page: str) -> list[str]:
    real, sim = families(real_page), families(sim_page)
    out = [f"missing {name}" for name in sorted(set(real) - set(sim))]
    for name, (kind, labels, values, buckets) in real.items():
        if name in sim and sim[name] != (kind, labels, values, buckets):
            out.append(f"differs {name}: real {(kind, labels, values, buckets)} sim {sim[name]}")
    return out


@pytest.mark.skipif(
    bool(PD_MISSING), reason=f"P/D captures missing in {GOLDEN}: {', '.join(PD_MISSING)}"
)
async def test_pd_legs_answer_with_the_same_shapes(tokenizer: Tokenizer) -> None:
    pd = json.loads((GOLDEN / "pd_manifest.json").read_text())
    async with (
        await start_fleet(
            2,
            profile="cpu-tiny",
            model="tiny",
            speed=20,
            role=["prefill", "decode"],
            tokenizer=tokenizer,
        ) as fleet,
        aiohttp.ClientSession() as http,
    ):
        prefill_url, decode_url = fleet.urls

        async def leg(url: str, name: str, kv: dict[str, Any] | None = None) -> str:
            entry = pd.get(name) or pd[f"{name} (decode)"]  # how the capture names legs
            body = dict(entry["request"])
            if kv is not None:
                body["kv_transfer_params"] = kv  # our prefill engine's, not the captured one
            async with http.post(url + entry["path"], json=body) as r:
                assert r.status == entry["status"], name
                assert r.headers["Content-Type"] == entry["headers"]["content-type"], name
                return await r.text()

        for prefill_name, decode_name in (
            ("pd_prefill.json", "pd_decode.json"),
            ("pd_prefill_for_stream.json", "pd_decode_stream.txt"),
        ):
            first = orjson.loads(await leg(prefill_url, prefill_name))
            if (GOLDEN / prefill_name).exists():
                assert shape(first) == shape(json.loads((GOLDEN / prefill_name).read_text()))
            second = await leg(decode_url, decode_name, first["kv_transfer_params"])
            golden = (GOLDEN / decode_name).read_text()
            if decode_name.endswith(".txt"):
                got, done = sse_chunks(second)
                want, want_done = sse_chunks(golden)
                assert done and want_done
                assert stream_shapes(got) == stream_shapes(want)
            else:
                assert shape(orjson.loads(second)) == shape(json.loads(golden))

        pages = []
        for url in fleet.urls:
            async with http.get(url + "/metrics") as r:
                pages.append(await r.text())
    assert not _family_differences((GOLDEN / "pd_prefill_metrics.txt").read_text(), pages[0])
    assert not _family_differences((GOLDEN / "pd_decode_metrics.txt").read_text(), pages[1])
    # The decode engine counted the pulled prompt as transferred, as vLLM does.
    transferred = [
        s.value
        for f in text_string_to_metric_families(pages[1])
        for s in f.samples
        if s.name == "vllm:prompt_tokens_by_source_total"
        and s.labels["source"] == "external_kv_transfer"
    ]
    assert transferred == [600.0]


@pytest.mark.skipif(
    not (GOLDEN / "pooling_manifest.json").exists(),
    reason=f"pooling captures missing in {GOLDEN}",
)
async def test_a_pooling_engine_answers_with_the_same_shapes(tokenizer: Tokenizer) -> None:
    """An engine of the cpu-tiny-embed profile answers every captured pooling request (and
    the generation route it lacks) as vLLM running the tiny model as an embedding model."""
    manifest = json.loads((GOLDEN / "pooling_manifest.json").read_text())
    async with (
        await start_fleet(
            1, profile="cpu-tiny-embed", model="tiny", speed=20, tokenizer=tokenizer
        ) as fleet,
        aiohttp.ClientSession() as http,
    ):
        assert await replay(http, fleet.urls[0], manifest) >= 9


@pytest.mark.skipif(
    not (GOLDEN / "classify_manifest.json").exists(),
    reason=f"classifier captures missing in {GOLDEN}",
)
async def test_a_classifying_engine_answers_with_the_same_shapes(tokenizer: Tokenizer) -> None:
    manifest = json.loads((GOLDEN / "classify_manifest.json").read_text())
    async with (
        await start_fleet(
            1, profile="cpu-tiny-classify", model="tiny", speed=20, tokenizer=tokenizer
        ) as fleet,
        aiohttp.ClientSession() as http,
    ):
        assert await replay(http, fleet.urls[0], manifest) >= 2

"""vLLM's route table, and what fleet-proxy does with each route.

Every path that `vllm serve` (0.32) answers is here, with how the proxy treats it:

- `generation`: relayed to a backend serving the request's model, streamed, movable;
- `pooling`: relayed whole to a backend serving the request's model (embeddings, scoring,
  reranking, classification: vLLM registers them only on engines running a pooling model);
- `tokenize`: relayed whole to a backend serving the request's model;
- `audio`: a multipart upload streamed through to a backend serving its form's `model`, the
  answer relayed as it comes (proxy/request/audio.py);
- `messages`: Anthropic's Messages API, relayed to a backend serving the request's model
  (streamed, retried before the first byte, not movable), errors in Anthropic's shape;
- `responses`: the Responses API, served by the proxy with its own store of responses, each
  new response generated on a backend (proxy/request/responses/);
- `fleet`: answered by the proxy itself, for the whole fleet (`/v1/models`, `/health`, and
  the LoRA adapter routes, which act on every engine serving the base model);
- `refused`: never sent to a backend, answered with an OpenAI-shaped error naming why.

The test against vLLM's own `/openapi.json` (tests/golden/vllm-0.32/) keeps this table
complete: a route a new vLLM adds fails it until it is given a line here. The table also has
OpenAI routes vLLM does not serve that the proxy answers itself (a response's input items).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.errors import error_body

How = Literal[
    "generation", "pooling", "tokenize", "audio", "messages", "fleet", "responses", "refused"
]


@dataclass(frozen=True, slots=True)
class Route:
    path: str  # as vLLM's OpenAPI document writes it, `{name}` for a path parameter
    methods: tuple[str, ...]
    how: How
    endpoint: str = ""  # the name in metrics and logs (relayed routes)
    status: int = 0  # refused routes: the answer's status
    reason: str = ""  # refused routes: why, in the client's error message


def _relayed(path: str, how: How, endpoint: str) -> Route:
    return Route(path, ("POST",), how, endpoint)


def _fleet(path: str, *methods: str) -> Route:
    return Route(path, methods or ("GET",), "fleet")


# What a router must not let its clients reach: each one acts on one engine (its weights, its
# caches, its scaling, its profiler), while a client behind the proxy does not choose the engine.
_ENGINE_CONTROL = (
    "it controls one engine, and a client behind a router does not choose the engine; "
    "operators reach engines directly or through fleet-proxy's /admin API"
)
# One engine's view, which is not the fleet's.
_ENGINE_VIEW = "it describes one engine, not the fleet; see GET /admin/backends"


def _engine_control(path: str, *methods: str) -> Route:
    return Route(path, methods or ("POST",), "refused", status=403, reason=_ENGINE_CONTROL)


def _engine_view(path: str, *methods: str) -> Route:
    return Route(path, methods or ("GET",), "refused", status=403, reason=_ENGINE_VIEW)


# Routes fleet-proxy does not relay yet. The one place later work replaces, route by route.
NOT_YET_SERVED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("/v1/chat/completions/batch", ("POST",)),
    ("/generative_scoring", ("POST",)),
    ("/v1/systemone", ("POST",)),
    ("/invocations", ("POST",)),
    ("/ping", ("GET", "POST")),
    ("/cohere/v2/chat", ("POST",)),
    ("/tokenizer_info", ("GET",)),
    ("/inference/v1/generate", ("POST",)),
    ("/v1/chat/completions/render", ("POST",)),
    ("/v1/completions/render", ("POST",)),
    ("/v1/messages/render", ("POST",)),
    ("/v1/responses/render", ("POST",)),
    ("/v1/chat/completions/derender", ("POST",)),
    ("/v1/completions/derender", ("POST",)),
)
_NOT_YET = "fleet-proxy does not serve it yet"

ROUTES: tuple[Route, ...] = (
    _relayed("/v1/completions", "generation", "completions"),
    _relayed("/v1/chat/completions", "generation", "chat/completions"),
    _relayed("/v1/embeddings", "pooling", "embeddings"),
    _relayed("/v2/embed", "pooling", "embeddings"),
    _relayed("/pooling", "pooling", "pooling"),
    _relayed("/classify", "pooling", "classify"),
    _relayed("/score", "pooling", "score"),
    _relayed("/v1/score", "pooling", "score"),
    _relayed("/rerank", "pooling", "rerank"),
    _relayed("/v1/rerank", "pooling", "rerank"),
    _relayed("/v2/rerank", "pooling", "rerank"),
    _relayed("/tokenize", "tokenize", "tokenize"),
    _relayed("/detokenize", "tokenize", "detokenize"),
    _relayed("/v1/audio/transcriptions", "audio", "audio/transcriptions"),
    _relayed("/v1/audio/translations", "audio", "audio/translations"),
    _relayed("/v1/messages", "messages", "messages"),
    _relayed("/v1/messages/count_tokens", "messages", "messages/count_tokens"),
    _fleet("/v1/models"),
    _fleet("/health"),
    _fleet("/metrics"),
    _fleet("/version"),
    Route("/v1/responses", ("POST",), "responses", "responses"),
    Route("/v1/responses/{response_id}", ("GET", "DELETE"), "responses", "responses"),
    Route("/v1/responses/{response_id}/cancel", ("POST",), "responses", "responses"),
    # Not a vLLM route: OpenAI's, which its clients call (`responses.input_items.list`).
    Route("/v1/responses/{response_id}/input_items", ("GET",), "responses", "responses"),
    _fleet("/v1/load_lora_adapter", "POST"),
    _fleet("/v1/unload_lora_adapter", "POST"),
    _engine_view("/load"),
    _engine_view("/kv_event_sources"),
    _engine_view("/server_info"),
    _engine_view("/is_sleeping"),
    _engine_view("/is_paused"),
    _engine_view("/weight_info"),
    _engine_view("/get_world_size"),
    _engine_view("/fault_tolerance/status"),
    _engine_control("/scale_elastic_ep"),
    _engine_control("/is_scaling_elastic_ep"),
    _engine_control("/inference/v1/abort_requests"),
    _engine_control("/abort_requests"),
    _engine_control("/reset_prefix_cache"),
    _engine_control("/reset_mm_cache"),
    _engine_control("/reset_encoder_cache"),
    _engine_control("/collective_rpc"),
    _engine_control("/sleep"),
    _engine_control("/wake_up"),
    _engine_control("/release_kv_cache_memory"),
    _engine_control("/start_profile"),
    _engine_control("/stop_profile"),
    _engine_control("/pause"),
    _engine_control("/resume"),
    _engine_control("/init_weight_transfer_engine"),
    _engine_control("/shutdown_weight_transfer_engine"),
    _engine_control("/start_weight_update"),
    _engine_control("/start_draft_weight_update"),
    _engine_control("/update_weights"),
    _engine_control("/finish_weight_update"),
    _engine_control("/update_weight_version"),
    _engine_control("/weight_checker"),
    _engine_control("/fault_tolerance/apply"),
    *(Route(p, m, "refused", status=501, reason=_NOT_YET) for p, m in NOT_YET_SERVED),
)

_RELAYED: frozenset[How] = frozenset({"generation", "pooling", "tokenize", "messages"})
# Endpoints whose answer is generated tokens, streamed when the client asks.
_GENERATES = frozenset({"completions", "chat/completions", "messages"})

# The paths the raw ASGI handler serves: (endpoint name, generates tokens). One dict lookup
# per request decides it.
HOT_ROUTES: dict[str, tuple[str, bool]] = {
    r.path: (r.endpoint, r.endpoint in _GENERATES) for r in ROUTES if r.how in _RELAYED
}
# The audio routes' paths and endpoint names: uploads the raw handler streams through.
AUDIO_ROUTES: dict[str, str] = {r.path: r.endpoint for r in ROUTES if r.how == "audio"}
# The paths that speak Anthropic's API: their errors are put in its shape.
ANTHROPIC_PATHS = frozenset(r.path for r in ROUTES if r.how == "messages")
# Endpoint names of the pooling routes (vLLM serves them only for pooling models).
POOLING_ENDPOINTS = frozenset(r.endpoint for r in ROUTES if r.how == "pooling")


def endpoint_name(path: str) -> str:
    """The metrics' endpoint name of a relayed route's path (a hot or an audio route)."""
    hot = HOT_ROUTES.get(path)
    return hot[0] if hot is not None else AUDIO_ROUTES[path]


REFUSED: tuple[Route, ...] = tuple(r for r in ROUTES if r.how == "refused")


def refusal_message(route: Route) -> str:
    """What a client sent to a refused route reads."""
    return f"fleet-proxy does not serve {route.path}: {route.reason}"


def not_a_pooling_model(model: str, path: str) -> bytes:
    """The 400 for a pooling route on an engine that runs `model` for generation: vLLM
    registers pooling routes only on pooling engines, so such an engine answers a bare 404."""
    message = (
        f"The model `{model}` does not support {path}: it is served here for generation, "
        "and pooling requests (embeddings, score, rerank, classify, pooling) need an engine "
        "running a pooling model (vLLM `--runner pooling`)"
    )
    return error_body(message, "invalid_request_error", "model", 400)

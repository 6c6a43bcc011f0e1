"""Settings from (highest first) command-line flags, FLEET_PROXY_* environment, a YAML file.

An invalid value stops start-up with a message naming the field (see `format_errors`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from fleet.registry import default_backend_id
from fleet.types import BackendSpec, Role
from flowcontrol.config import FlowControlConfig
from proxy.stream.move_kinds import MoveCosts
from proxy.stream.token_ledger import DEFAULT_MAX_EVENT_BYTES
from proxy.url_policy import parse_allow_entry
from rescheduler.config import (
    LOAD_METRICS,
    POLICIES,
    FailoverDomain,
    ReschedulerConfig,
    Scope,
    SelectOrder,
    SelectRule,
)

# Printable ASCII without spaces (it goes out in headers and metric labels) and without "/"
# (the admin API names a backend by its id as one URL path segment: /admin/backends/{id}/drain).
_BACKEND_ID = re.compile(r"[\x21-\x2e\x30-\x7e]{1,128}")


def check_api_key(key: str) -> None:
    """A key goes into a header value, and must survive being copied from a file or a shell."""
    if not key or any(not ("\x21" <= c <= "\x7e") for c in key):
        raise ValueError("an API key must be 1 or more printable ASCII characters, no spaces")


def check_kv_events_endpoint(endpoint: str) -> str:
    """An engine's KV-event address the proxy connects to: `tcp://HOST:PORT` or `ipc://PATH`.
    A wildcard host would make the proxy bind instead, as the engine does with one."""
    v = endpoint.strip()
    if not v.startswith(("tcp://", "ipc://")):
        raise ValueError(f"a KV-events endpoint is tcp://HOST:PORT or ipc://PATH, got {v!r}")
    if v.startswith("tcp://"):
        host, _, port = v[len("tcp://") :].rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"a KV-events endpoint is tcp://HOST:PORT, got {v!r}")
        if host in ("*", "[::]", "0.0.0.0"):
            raise ValueError(
                f"{v!r} is an address to bind: give the engine tcp://*:PORT and the proxy "
                "tcp://ENGINE_HOST:PORT"
            )
    return v


log = logging.getLogger("fleet_proxy.settings")

# Old setting name -> its new name; the old one is still accepted, with a warning.
RENAMED_SETTINGS = {"max_connections": "max_idle_connections_per_backend"}


class BackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    id: str | None = None
    role: Role = Role.BOTH
    node: str = ""
    unit: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    # Normally learned from the backend's /v1/models; set to pin them.
    models: list[str] = Field(default_factory=list)
    # The engine's KV-cache event publisher (`tcp://ENGINE_HOST:PORT`; the engine binds
    # `tcp://*:PORT`) and its replay socket: routing by the precise prefix-cache scorer
    # (docs/policies.md). None: the engine publishes none; the approximate index is used.
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None

    @field_validator("id")
    @classmethod
    def _printable_id(cls, v: str | None) -> str | None:
        if v is not None and not _BACKEND_ID.fullmatch(v):
            raise ValueError(
                "backend id must be 1-128 printable ASCII characters without spaces or '/', "
                f"got {v!r}"
            )
        return v

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.isascii():
            raise ValueError(f"backend url must be ASCII (a host in its IDNA form), got {v!r}")
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {v!r}")
        if "@" in urlsplit(v).netloc:
            # It would show in /admin/backends, the log and metric labels.
            raise ValueError("backend url must not carry credentials (user:password@)")
        if v.endswith("/v1"):
            v = v[: -len("/v1")]
        return v

    @field_validator("kv_events_endpoint", "kv_events_replay_endpoint")
    @classmethod
    def _zmq_endpoint(cls, v: str | None) -> str | None:
        return None if v is None else check_kv_events_endpoint(v)

    @model_validator(mode="after")
    def _replay_needs_events(self) -> BackendConfig:
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ValueError("kv_events_replay_endpoint needs kv_events_endpoint")
        return self

    def to_spec(self) -> BackendSpec:
        return BackendSpec(
            id=self.id or default_backend_id(self.url),
            url=self.url,
            role=self.role,
            node=self.node,
            unit=self.unit,
            labels=dict(self.labels),
            models=tuple(self.models),
            kv_events_endpoint=self.kv_events_endpoint or "",
            kv_events_replay_endpoint=self.kv_events_replay_endpoint or "",
        )


class ApiKey(BaseModel):
    """A client key that names its tenant (flow control's fairness id)."""

    model_config = ConfigDict(extra="forbid")

    key: SecretStr
    tenant: str | None = Field(None, min_length=1, max_length=128)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEET_PROXY_", extra="forbid", env_nested_delimiter="__"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_settings(cls, data: Any) -> Any:
        """Old names of renamed settings, from a file, overrides or FLEET_PROXY_<OLD>, are
        read as the new name (which wins when both are given), with a warning."""
        if not isinstance(data, dict):
            return data
        for old, new in RENAMED_SETTINGS.items():
            env = os.environ.get(f"FLEET_PROXY_{old.upper()}")
            if old not in data and env is None:
                continue
            value = data.pop(old) if old in data else env
            log.warning("setting %r is deprecated and will be removed: use %r", old, new)
            data.setdefault(new, value)
        return data

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    backends: list[BackendConfig] = Field(default_factory=list)
    policy: str = "least_requests"
    # The YAML form of routing (plugins and profiles, or an llm-d EndpointPickerConfig);
    # overrides `policy` when given.
    routing: dict[str, Any] | None = None
    admin_token: SecretStr | None = None
    # Seconds an engine may take to answer a LoRA adapter load or unload the proxy fans out
    # (an engine reads the adapter's weights before it answers).
    lora_adapter_timeout: float = Field(60.0, gt=0, allow_inf_nan=False)
    # --- client access control (proxy/serving/access.py, README.md "Access control")
    # Keys clients must send as `Authorization: Bearer <key>` on the OpenAI endpoints; with
    # none here and no api_keys_file, those endpoints are open. A comma list or a YAML list;
    # an entry may be `{key: ..., tenant: ...}` to name the key's tenant for flow control.
    api_keys: Annotated[list[SecretStr | ApiKey], NoDecode] = Field(default_factory=list)
    # One key per line (`KEY` or `KEY tenant=NAME`), `#` comments; read at start-up, added to
    # api_keys.
    api_keys_file: Path | None = None
    # Pass the client's Authorization header on to the backends (off: it stays on the
    # client's hop, since it is the client's key to this proxy).
    forward_client_authorization: bool = False
    # For backends started with `vllm serve --api-key`: sent as `Authorization: Bearer` on
    # every request to a backend, forwarded and control-plane alike.
    backend_api_key: SecretStr | None = None
    # CORS for browser clients (Starlette's CORSMiddleware); off while no origin is listed.
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    cors_allow_headers: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["*"])
    cors_allow_methods: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["GET", "POST"]
    )
    cors_allow_credentials: bool = False

    scrape_interval: float = Field(0.2, gt=0)
    health_interval: float = Field(1.0, gt=0)
    # The path of each backend's health check (vLLM: /health); 200 means healthy.
    health_check_path: str = "/health"
    unhealthy_after: int = Field(2, ge=1, description="failed health checks in a row")
    models_interval: float = Field(10.0, gt=0)
    scrape_timeout: float = Field(1.0, gt=0)
    stale_after: float = Field(2.0, gt=0, description="seconds before a snapshot is stale")

    connect_timeout: float = Field(5.0, gt=0, allow_inf_nan=False)
    read_timeout: float = Field(
        600.0, gt=0, allow_inf_nan=False, description="max silence from a backend"
    )
    max_attempts: int = Field(3, ge=1, le=10, description="tries before the first byte")
    # Movable requests (proxy/request/session.py): generation requests record their token ids so
    # that a broken, stalled or drained backend's streams continue on another backend.
    movable_requests: bool = True
    # Non-streamed requests too: streamed from the backend and answered whole by the proxy, so
    # they can move; costs the proxy a parse of every event (docs/performance.md).
    assemble_non_streamed: bool = False
    stall_timeout: float = Field(
        5.0, gt=0, allow_inf_nan=False, description="silence mid-stream that counts as a stall"
    )
    max_moves: int = Field(3, ge=0, le=20, description="moves of one request, planned or not")
    move_timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="the admin API's wait for a planned move"
    )
    # How a planned move carries the KV to its target (proxy/stream/move_kinds.py): `auto` picks per
    # move by the predicted downtime below; a forced kind needing KV transfer (handover,
    # precopy) falls back to recompute unless both ends have the label `kv_connector: nixl`.
    move_kind: Literal["auto", "recompute", "handover", "precopy"] = "auto"
    move_recompute_s_per_token: float = Field(
        1e-4, ge=0, allow_inf_nan=False, description="a target's prefill cost per token"
    )
    move_transfer_s_per_token: float = Field(
        1e-5, ge=0, allow_inf_nan=False, description="a NIXL KV pull's cost per token"
    )
    move_kv_leg_s: float = Field(
        0.02, ge=0, allow_inf_nan=False, description="fixed cost of one extra 1-token request"
    )
    move_precopy_min_tokens: int = Field(
        2048, ge=1, description="tokens (prompt + generated) from which `auto` pre-copies"
    )
    # Outcome-based ejection (fleet/outliers.py): a backend whose requests keep failing leaves
    # routing for a while, even when its /health answers.
    outlier_detection: bool = True
    outlier_consecutive_failures: int = Field(
        5, ge=1, le=1000, description="failures in a row that eject a backend"
    )
    outlier_window: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="max seconds between chained failures"
    )
    outlier_base_ejection: float = Field(
        10.0, gt=0, allow_inf_nan=False, description="first ejection; doubles each time after"
    )
    outlier_max_ejection: float = Field(300.0, gt=0, allow_inf_nan=False)
    outlier_max_ejected_fraction: float = Field(
        0.5, gt=0, le=1, description="share of the fleet ejected at once (at least one)"
    )
    max_body_bytes: int = Field(10 * 1024 * 1024, gt=0)
    # An audio upload (/v1/audio/*) this size or smaller is held whole, so that a backend
    # failing before its answer can be replaced by another; a larger one streams through
    # to one backend, held only until its `model` field is read, and is not tried again.
    audio_replay_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="audio uploads up to this size are held and may be retried; larger "
        "ones stream through to one backend",
    )
    # Bodies in flight across the serving process: without a total, a few hundred bodies
    # under max_body_bytes each exhaust the machine. A body costs about three times its size
    # in memory while its request runs (read, parsed, sent on): 128 MiB holds 12 bodies at the
    # cap at once (about 400 MB of memory), thousands of ordinary ones.
    max_body_bytes_in_flight: int = Field(
        128 * 1024 * 1024,
        gt=0,
        description="request-body bytes a serving process holds at once; past it a request "
        "waits up to body_bytes_wait, then gets 503",
    )
    body_bytes_wait: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="seconds a body waits for room in flight"
    )
    # A request that made this many backends fail one after another (an engine timing out,
    # dropping the connection or answering 500/502/504 under it) looks like the cause: it is
    # not sent to another one, so it cannot take the whole fleet down. 0: no such limit.
    max_backends_failed_in_a_row: int = Field(
        2, ge=0, description="backends a request may make fail in a row before it is stopped"
    )
    max_sse_event_bytes: int = Field(
        DEFAULT_MAX_EVENT_BYTES,
        ge=1024,
        description="bytes one streamed SSE event may hold before its end; past it the backend "
        "counts as failed (a movable request continues elsewhere)",
    )
    hold_answer_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="bytes of a non-streamed answer read whole before it is relayed, so that "
        "a backend breaking while sending it is retried elsewhere; a larger answer is relayed "
        "as it comes, and a break after that closes the client's connection short",
    )
    max_held_answer_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="bytes the proxy holds of an answer it needs whole: a non-streamed answer "
        "assembled from a backend's stream (counted as the stream's bytes) and a backend's "
        "400 or 404 (put in the OpenAI error shape); past it the client gets 502",
    )
    # Was `max_connections` (still read, with a warning): it never capped open connections.
    max_idle_connections_per_backend: int = Field(
        2048, ge=1, description="idle keep-alive connections kept per backend"
    )
    chars_per_token: float = Field(4.0, gt=0)
    # The request's session for session-affinity routing (RequestContext.session_id): this
    # header, else this top-level string field of the body; None (or "") turns either off.
    session_header: str | None = "x-session-id"
    session_body_field: str | None = "user"
    # Model names clients may use for a served model (alias -> the backends' name): rewritten
    # in the request before routing; answers keep the backends' name (README.md).
    model_aliases: dict[str, str] = Field(default_factory=dict)
    # Prompt token counting for routing (fleet/tokens.py): a character estimate, a local HF
    # tokenizer.json (run in a worker thread), or the backends' own /tokenize.
    token_counter: Literal["estimate", "hf", "remote"] = "estimate"
    tokenizer_path: str | None = None
    # --- precise prefix-cache routing (docs/policies.md), only for a routing configuration
    # with a precise-prefix-cache-scorer or a `precise_prefix` section. The prompt's token
    # ids come from the backends' own /tokenize (`remote`), or from tokenizer_path (`hf`: a
    # local tokenizer.json and the chat template of its tokenizer_config.json).
    prompt_tokenizer: Literal["remote", "hf"] = "remote"
    prompt_token_cache_tokens: int = Field(
        4_000_000, ge=0, description="token ids of recent prompts kept (4 bytes each)"
    )
    # The topic the engines publish their KV-cache events under (`topic` of vLLM's
    # --kv-events-config); "" takes every topic.
    kv_events_topic: str = ""
    kv_events_replay_timeout: float = Field(
        2.0, gt=0, allow_inf_nan=False, description="seconds a replay of missed events may take"
    )
    # How a decision with a prefill backend is carried out (proxy/backends/disagg.py).
    pd_mode: Literal["orchestrated", "header"] = "orchestrated"
    pd_prefill_timeout: float = Field(30.0, gt=0)
    # --- exposure (safe by default)
    # Honour a client's `x-fleet-debug: 1` (routing scores and legs in the answer): an operator
    # tool, since it shows the fleet's names and load to whoever asks.
    debug_receipts: bool = False
    # Name the answering backend in `x-fleet-backend` on every response.
    backend_header: bool = True
    # Backend ids, addresses and backend error text in client-facing error messages; off, a
    # client learns only what failed (the admin API and the log keep the details).
    error_details: bool = False
    # Backend URLs the admin API may add at run time: CIDRs ("10.0.0.0/8") or host name
    # patterns ("*.svc.cluster.local", "vllm-*"). A name matching no pattern must resolve only
    # to addresses inside the listed CIDRs. Backends in the configuration are not checked.
    backend_url_allow: list[str] = Field(
        default_factory=lambda: [
            "127.0.0.0/8",
            "::1/128",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "fc00::/7",
        ]
    )
    backend_url_schemes: list[Literal["http", "https"]] = Field(
        default_factory=lambda: list[Literal["http", "https"]](("http", "https"))
    )
    # Link-local addresses (169.254.0.0/16, fe80::/10: cloud metadata services live there)
    # are refused unless this is set (then all of them are allowed).
    backend_url_allow_link_local: bool = False
    log_level: str = "info"
    # Serving processes (proxy/serving/workers.py). 1 runs the proxy in this process, as always;
    # more share one listening port and their per-backend accounting (fleet/peer_load.py).
    workers: int = Field(1, ge=1, le=64)
    # With workers > 1: how often each worker publishes its load, reads its peers' load and
    # applies admin changes made through another worker.
    peer_sync_interval: float = Field(0.02, gt=0, le=5)
    # How workers share the port: one SO_REUSEPORT socket each, the kernel spreading new
    # connections over them ("reuseport"), or one listening socket they all accept on
    # ("shared", where one worker may take a whole burst of connections): docs/performance.md.
    worker_listen: Literal["shared", "reuseport"] = "reuseport"

    # The client-facing HTTP server's limits (proxy/serving/front_door.py, docs/reliability.md).
    client_max_connections: int = Field(
        8192,
        ge=1,
        description="open client connections per serving process; when they are all open, a "
        "new one takes the place of the one waiting longest for its request (sent nothing or "
        "part of its headers; else dribbling its body), or gets 503 when every one is busy",
    )
    client_address_share: float = Field(
        0.5,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="share of client_max_connections one client address may hold before, with "
        "the table full, its waiting connections are the first closed and its new ones may "
        "take the place only of its own (else 503)",
    )
    client_max_header_count: int = Field(
        100, ge=1, description="headers in one request; more get 431"
    )
    client_max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="bytes of a request line and its headers; more get 431"
    )
    max_forwarded_header_bytes: int = Field(
        8 * 1024,
        ge=1024,
        description="bytes of the client's headers the proxy forwards to a backend (names, "
        "values and 4 bytes of framing each); more get 431, since engines refuse large "
        "headers with answers of their own",
    )
    client_header_timeout: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds from connection open, or a keep-alive request's first byte, to "
        "the end of the headers; then 408",
    )
    client_body_timeout: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds from the end of the headers to the end of the body; then 408",
    )
    client_keep_alive_timeout: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds an idle client connection is kept open between requests",
    )
    # One JSON line per finished OpenAI request (proxy/control/request_log.py), written off the
    # request's path; `off` builds nothing.
    request_log: Literal["off", "json"] = "off"
    request_log_file: Path | None = None  # None: stderr
    request_log_sample_rate: float = Field(
        1.0, ge=0, le=1, allow_inf_nan=False, description="share of requests logged"
    )
    # On SIGTERM or SIGINT: stop accepting, let requests and streams finish for this long, then
    # close what is left and exit (proxy/serving/front_door.py GracefulServer).
    shutdown_grace_period: float = Field(
        30.0, ge=0, allow_inf_nan=False, description="seconds requests may take to finish"
    )
    # Admission control (proxy/serving/admission.py): off while max_concurrent_requests is None.
    max_concurrent_requests: int | None = Field(
        None, ge=1, description="OpenAI requests running at once per serving process"
    )
    admission_queue_size: int = Field(
        256, ge=0, description="requests that may wait for a slot; more get 429"
    )
    admission_queue_timeout: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds a request may wait for a slot; then 429",
    )
    # The Responses API's stored responses (proxy/request/responses/, docs/api.md "Responses
    # API"): an SQLite file, or memory when unset (with several workers, a temporary file the
    # supervisor gives them all instead, so that they see each other's responses).
    responses_store_path: Path | None = None
    # A PostgreSQL URL (postgresql://user:password@host/db) instead: one store several proxy
    # replicas share (needs the `postgres` extra: psycopg 3).
    responses_store_url: SecretStr | None = None
    responses_ttl: float = Field(
        30 * 86400.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds a stored response is kept after it was created",
    )
    responses_store_max_bytes: int = Field(
        256 << 20,
        ge=1,
        description="bytes of stored responses kept; past it the oldest go first",
    )
    # Flow control (flowcontrol/, proxy/serving/flow_gate.py, docs/flow-control.md): tenants,
    # priorities and fairness while a model's backends are saturated. Off while None.
    flow_control: FlowControlConfig | None = None

    # --- the rescheduler (rescheduler/, docs/rescheduler.md): moves live requests between
    # backends to balance load and to leave failing ones, every rescheduling_interval_ms.
    enable_rescheduling: bool = False
    # A comma list or a YAML list, from rescheduler.config.POLICIES.
    rescheduling_policies: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(ReschedulerConfig().policies)
    )
    rescheduling_interval_ms: int = Field(500, ge=10, le=3_600_000)
    rescheduling_decode_load_metric: str = "kv_cache_usage_ratio_projected"
    rescheduling_decode_load_threshold: float = Field(1.0, ge=0, allow_inf_nan=False)
    rescheduling_neutral_load_metric: str = "kv_cache_usage_ratio_projected"
    rescheduling_neutral_load_threshold: float = Field(1.0, ge=0, allow_inf_nan=False)
    rescheduling_load_balance_threshold: float = Field(0.0, ge=0, allow_inf_nan=False)
    rescheduling_load_balance_scope: Scope = Scope.CLUSTER
    failover_domain: FailoverDomain = FailoverDomain.INSTANCE
    instance_staleness_seconds: float = Field(60.0, gt=0, allow_inf_nan=False)
    rescheduling_req_select_rule: SelectRule = SelectRule.TOKEN
    rescheduling_req_select_order: SelectOrder = SelectOrder.SR
    rescheduling_req_select_value: float = Field(1024.0, gt=0, allow_inf_nan=False)
    tpot_slo: float = Field(50.0, gt=0, allow_inf_nan=False, description="milliseconds")
    tpot_slo_dispatch_threshold: float = Field(0.85, gt=0, allow_inf_nan=False)
    tpot_migrate_out_ceil_threshold: float = Field(0.95, gt=0, allow_inf_nan=False)
    tpot_migrate_out_floor_threshold: float = Field(0.60, ge=0, allow_inf_nan=False)
    rescheduling_migration_timeout: float = Field(
        5.0, gt=0, allow_inf_nan=False, description="seconds one migration may take"
    )
    rescheduling_max_concurrent_migrations: int = Field(10, ge=1, le=1000)
    rescheduling_history: int = Field(20, ge=0, le=10_000, description="cycles kept")

    # --- the planner (planner/, docs/planner.md): scales the fleet's workers up and down,
    # started as local processes, from the load this proxy observes.
    planner_enabled: bool = False
    # A YAML file of the planner's settings (the keys `fleet-proxy plan --config` reads).
    planner_config: Path | None = None
    # Worker command templates with {port} and {role}, shell-split; None: the simulator.
    planner_prefill_command: str | None = None
    planner_decode_command: str | None = None
    planner_gpus: str | None = Field(None, description="GPU ids to hand out, comma-separated")
    planner_state_file: Path = Path("fleet-planner-state.json")
    planner_worker_log_dir: Path | None = None  # each worker's output; None: discarded
    planner_log_dir: Path | None = None  # TensorBoard event files; None: none written
    planner_start_timeout: float = Field(
        600.0, gt=0, allow_inf_nan=False, description="seconds for a new worker's /health"
    )
    planner_drain_deadline: float = Field(
        120.0, gt=0, allow_inf_nan=False, description="seconds a drain may take"
    )
    # Where workers run: local processes, or the pods of a Deployment or StatefulSet per role.
    planner_environment: Literal["local", "kubernetes"] = "local"
    planner_namespace: str | None = None  # None: the in-cluster namespace, else `default`
    # Names the default pod selectors fleet-proxy.io/model=<name>,fleet-proxy.io/role=<role>.
    planner_served_model_name: str | None = None
    planner_prefill_target: str | None = None  # deployment/NAME or statefulset/NAME
    planner_decode_target: str | None = None
    planner_prefill_selector: str | None = None  # the role's pod label selector
    planner_decode_selector: str | None = None
    planner_engine_port: int = Field(8000, ge=1, le=65535, description="the pods' engine port")
    planner_kubeconfig: Path | None = None  # None: in-cluster config, else ~/.kube/config
    # Register new pods with this proxy; off when pods are discovered by other means.
    planner_register: bool = True

    # --- backends discovered from Kubernetes pods (fleet/pod_backends.py, docs/deploy.md): the
    # Ready pods behind a label selector, kept by list-then-watch, added and removed as they
    # come and go; backends from the settings and the admin API are left alone.
    discovery_kubernetes: bool = False
    discovery_namespace: str | None = None  # None: the in-cluster namespace, else `default`
    discovery_label_selector: str = "fleet-proxy.io/model"
    discovery_port: int = Field(
        8000, ge=1, le=65535, description="the engine's port unless a pod's annotation says"
    )
    discovery_kubeconfig: Path | None = None  # None: in-cluster config, else ~/.kube/config
    discovery_drain_timeout: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds a gone pod's backend waits for its requests before removal",
    )

    @field_validator(
        "api_keys", "cors_allow_origins", "cors_allow_headers", "cors_allow_methods", mode="before"
    )
    @classmethod
    def _json_or_comma_list(cls, v: Any) -> Any:
        # The environment gives a string: a JSON list, or names separated by commas.
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"not a JSON list: {e}") from None
            return [part.strip() for part in text.split(",") if part.strip()]
        return v

    @field_validator("api_keys")
    @classmethod
    def _usable_keys(cls, v: list[SecretStr | ApiKey]) -> list[SecretStr | ApiKey]:
        for key in v:
            check_api_key((key.key if isinstance(key, ApiKey) else key).get_secret_value())
        return v

    def client_keys(self) -> list[tuple[str, str | None]]:
        """Each of `api_keys` with the tenant it names (None: none)."""
        return [
            (k.key.get_secret_value(), k.tenant)
            if isinstance(k, ApiKey)
            else (k.get_secret_value(), None)
            for k in self.api_keys
        ]

    @field_validator("backend_api_key")
    @classmethod
    def _usable_backend_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            check_api_key(v.get_secret_value())
        return v

    @model_validator(mode="after")
    def _one_authorization_upstream(self) -> Settings:
        if self.forward_client_authorization and self.backend_api_key is not None:
            raise ValueError(
                "forward_client_authorization and backend_api_key are both set: the backend key "
                "replaces the client's Authorization header; set one of them"
            )
        return self

    @field_validator("rescheduling_policies", mode="before")
    @classmethod
    def _policy_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [p for p in v.replace(",", " ").split() if p]
        return v

    @field_validator("rescheduling_policies")
    @classmethod
    def _known_policies(cls, v: list[str]) -> list[str]:
        unknown = [p for p in v if p not in POLICIES]
        if unknown:
            raise ValueError(
                f"unknown rescheduling policy {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(POLICIES)}"
            )
        if len(set(v)) != len(v):
            raise ValueError("rescheduling_policies names a policy twice")
        return v

    @field_validator("rescheduling_decode_load_metric", "rescheduling_neutral_load_metric")
    @classmethod
    def _known_load_metric(cls, v: str) -> str:
        if v not in LOAD_METRICS:
            raise ValueError(f"unknown load metric {v!r}; known: {', '.join(LOAD_METRICS)}")
        return v

    @model_validator(mode="after")
    def _body_fits_in_flight(self) -> Settings:
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValueError(
                f"max_body_bytes_in_flight ({self.max_body_bytes_in_flight}) is below "
                f"max_body_bytes ({self.max_body_bytes}): a body at the limit would never fit"
            )
        return self

    @model_validator(mode="after")
    def _one_responses_store(self) -> Settings:
        if self.responses_store_path is not None and self.responses_store_url is not None:
            raise ValueError(
                "responses_store_path and responses_store_url are both set: the stored "
                "responses live in one store, an SQLite file or a PostgreSQL database"
            )
        return self

    @model_validator(mode="after")
    def _planner_in_one_process(self) -> Settings:
        if self.planner_enabled and self.workers > 1:
            raise ValueError(
                "planner_enabled needs workers = 1: each serving process has its own live "
                "requests, and a drain must see every request on the worker it removes; with "
                "several workers run the planner beside the proxy (`fleet-proxy plan --proxy "
                "URL`, docs/planner.md)"
            )
        return self

    @model_validator(mode="after")
    def _rescheduling_consistent(self) -> Settings:
        if self.tpot_migrate_out_floor_threshold > self.tpot_migrate_out_ceil_threshold:
            raise ValueError(
                "tpot_migrate_out_floor_threshold must not exceed tpot_migrate_out_ceil_threshold"
            )
        if (
            self.rescheduling_req_select_rule == SelectRule.RATIO
            and self.rescheduling_req_select_value > 1
        ):
            raise ValueError("rescheduling_req_select_value is a share (0..1] with rule RATIO")
        return self

    def rescheduler_config(self, workers: int = 1) -> ReschedulerConfig:
        """The decision core's settings. With `workers` processes each moving only its own
        requests, an amount to move (TOKEN, NUM_REQ, RATIO) is split between them, so the
        fleet-wide amount stays what was configured (docs/rescheduler.md)."""
        value = self.rescheduling_req_select_value
        if workers > 1:
            value = value / workers
            if self.rescheduling_req_select_rule == SelectRule.NUM_REQ:
                value = float(max(1, math.ceil(value)))
        return ReschedulerConfig(
            policies=tuple(self.rescheduling_policies),
            decode_load_metric=self.rescheduling_decode_load_metric,
            decode_load_threshold=self.rescheduling_decode_load_threshold,
            neutral_load_metric=self.rescheduling_neutral_load_metric,
            neutral_load_threshold=self.rescheduling_neutral_load_threshold,
            load_balance_threshold=self.rescheduling_load_balance_threshold,
            load_balance_scope=self.rescheduling_load_balance_scope,
            failover_domain=self.failover_domain,
            instance_staleness_s=self.instance_staleness_seconds,
            req_select_rule=self.rescheduling_req_select_rule,
            req_select_order=self.rescheduling_req_select_order,
            req_select_value=value,
            tpot_slo_s=self.tpot_slo / 1000.0,
            tpot_dispatch_threshold=self.tpot_slo_dispatch_threshold,
            tpot_migrate_out_ceil_threshold=self.tpot_migrate_out_ceil_threshold,
            tpot_migrate_out_floor_threshold=self.tpot_migrate_out_floor_threshold,
        )

    @field_validator("backends", mode="before")
    @classmethod
    def _urls_as_backends(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [u for u in v.replace(",", " ").split() if u]
        if isinstance(v, list):
            return [{"url": item} if isinstance(item, str) else item for item in v]
        return v

    @field_validator("backend_url_allow")
    @classmethod
    def _allow_entries(cls, v: list[str]) -> list[str]:
        for entry in v:
            try:
                parse_allow_entry(entry)
            except ValueError as e:
                raise ValueError(f"backend_url_allow: {e}") from None
        return v

    @field_validator("session_header", "session_body_field")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("session_header")
    @classmethod
    def _header_name(cls, v: str | None) -> str | None:
        # Header names are matched as the server hands them over: lower case.
        if v is not None and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", v):
            raise ValueError(f"not an HTTP header name: {v!r}")
        return v.lower() if v is not None else None

    @field_validator("model_aliases")
    @classmethod
    def _aliases_one_step(cls, v: dict[str, str]) -> dict[str, str]:
        for alias, served in v.items():
            if not alias or not served:
                raise ValueError("an alias and its model must be non-empty names")
            if served in v:
                raise ValueError(
                    f"alias {alias!r} names {served!r}, itself an alias: name the served model"
                )
        return v

    @field_validator("health_check_path")
    @classmethod
    def _absolute_path(cls, v: str) -> str:
        if not v.startswith("/") or not v.isascii() or any(c.isspace() for c in v):
            raise ValueError("health_check_path must be a URL path starting with /, no spaces")
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.lower()
        if v not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError("log_level must be one of critical, error, warning, info, debug")
        return v

    @model_validator(mode="after")
    def _tokenizer_needs_path(self) -> Settings:
        if self.token_counter == "hf" and not self.tokenizer_path:
            raise ValueError("token_counter 'hf' needs tokenizer_path (a local tokenizer.json)")
        if self.prompt_tokenizer == "hf" and not self.tokenizer_path:
            raise ValueError(
                "prompt_tokenizer 'hf' needs tokenizer_path (a directory with tokenizer.json "
                "and tokenizer_config.json)"
            )
        return self

    def move_costs(self) -> MoveCosts:
        return MoveCosts(
            recompute_s_per_token=self.move_recompute_s_per_token,
            transfer_s_per_token=self.move_transfer_s_per_token,
            kv_leg_s=self.move_kv_leg_s,
            precopy_min_tokens=self.move_precopy_min_tokens,
        )

    def backend_specs(self) -> list[BackendSpec]:
        specs = [b.to_spec() for b in self.backends]
        seen: set[str] = set()
        for s in specs:
            if s.id in seen:
                raise ValueError(f"backends: duplicate backend id {s.id!r}")
            seen.add(s.id)
        return specs


class ConfigError(Exception):
    pass


def load_settings(
    overrides: dict[str, Any] | None = None, config_file: Path | None = None
) -> Settings:
    """Build Settings; raises ConfigError with one line per bad field."""
    file_values = read_config_file(config_file) if config_file is not None else None

    class _FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
            if file_values is not None:
                sources += (InitSettingsSource(settings_cls, init_kwargs=file_values),)
            return sources

    try:
        settings: Settings = _FileSettings(**(overrides or {}))
        settings.backend_specs()
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None
    except SettingsError as e:
        raise ConfigError(_env_error(e)) from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return settings


def read_config_file(path: Path) -> dict[str, Any]:
    """The YAML settings file as a mapping; its faults as one line naming file and place."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path}: cannot be read: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {path}{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: want a mapping of setting names to values "
            f"(port: 8000, backends: [...]), got a {type(data).__name__}"
        )
    return data


_SOURCE_ERROR = re.compile(r'field "(\w+)" from source "(\w+)"')


def _env_error(error: SettingsError) -> str:
    """A list or mapping setting whose environment variable is not valid JSON, in one line."""
    found = _SOURCE_ERROR.search(str(error))
    if found is None or found.group(2) != "EnvSettingsSource":
        return str(error)
    name = "FLEET_PROXY_" + found.group(1).upper()
    example = ' (e.g. ["http://10.0.0.5:8000", "http://10.0.0.6:8000"])'
    return (
        f"{name} must be JSON{example if found.group(1) == 'backends' else ''}: "
        f"{error.__cause__ or error}"
    )


# Their values never go into an error message: it is printed and logged.
_SECRET_FIELDS = frozenset({"admin_token", "api_keys", "backend_api_key"})


def format_errors(error: ValidationError) -> str:
    lines = ["invalid settings:"]
    for err in error.errors():
        loc = err["loc"]
        field = ".".join(str(p) for p in loc) or "(settings)"
        # A whole-model check's input is every setting given, secrets included; a message that
        # quotes the text given already is not made to say it twice.
        given = err.get("input")
        if (
            not loc
            or loc[0] in _SECRET_FIELDS
            or (isinstance(given, str) and repr(given) in err["msg"])
        ):
            lines.append(f"  {field}: {err['msg']}")
        else:
            lines.append(f"  {field}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)

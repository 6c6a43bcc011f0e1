"""When a router in front of a simulated fleet is ready to be measured: it has answered a real
completion, not merely its health route.

sglang-router with its defaults registers its workers 30-60 s after it starts and answers
503 `no_available_workers` until then, while its /health already says 200; a run started at
/health would measure the registration, not the routing. It also lists a vLLM model as
`unknown` (it reads SGLang-only info routes), so the model is read from an engine of the
fleet, and every request names it.
"""

from __future__ import annotations

import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

# Answers a router gives while its workers are not registered yet, or not healthy yet.
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})


def router_executable(name: str, peers_venv: Path | None = None) -> str | None:
    """A peer router's command: from `peers_venv`/bin when given, else the venv running this
    script, else PATH."""
    places = [] if peers_venv is None else [str(peers_venv / "bin")]
    places.append(str(Path(sys.executable).parent))
    for place in places:
        if found := shutil.which(name, path=place):
            return found
    return shutil.which(name)


def fleet_model(engine_url: str, timeout_s: float = 5.0) -> str:
    """The model an engine serves, from its own /v1/models."""
    with urllib.request.urlopen(f"{engine_url}/v1/models", timeout=timeout_s) as resp:
        return str(orjson.loads(resp.read())["data"][0]["id"])


def bench_api(bench_args: Sequence[str]) -> str:
    """The API `fleet-proxy bench` will use with these flags: chat unless `--api completions`."""
    api = "chat"
    for i, arg in enumerate(bench_args):
        if arg == "--api" and i + 1 < len(bench_args):
            api = bench_args[i + 1]
        elif arg.startswith("--api="):
            api = arg.partition("=")[2]
    return api


@dataclass(frozen=True, slots=True)
class Served:
    """How long the router took to answer its first completion, and what it said before."""

    seconds: float
    attempts: int
    refusals: tuple[str, ...]  # the distinct non-200 answers, e.g. "503 no_available_workers"


class NotServing(RuntimeError):
    """The router never answered a completion. A RuntimeError, so a campaign skips the
    setting and goes on."""


def completion_request(base_url: str, model: str, api: str) -> urllib.request.Request:
    """One short completion that names the model, non-streaming, one output token."""
    if api == "completions":
        path, body = "/v1/completions", {"prompt": "ready?"}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "ready?"}]}
    body |= {"model": model, "max_tokens": 1, "stream": False}
    return urllib.request.Request(
        base_url + path,
        data=orjson.dumps(body),
        headers={"content-type": "application/json"},
        method="POST",
    )


def _refusal(status: int, body: bytes) -> str:
    """`503 no_available_workers`: the status and the first words of the body."""
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return f"{status} {text[:120]}".strip()


def wait_until_serving(
    base_url: str,
    model: str,
    api: str = "chat",
    *,
    alive: Callable[[], bool] = lambda: True,
    timeout_s: float = 120.0,
    interval_s: float = 0.5,
) -> Served:
    """Poll one completion until the router answers 200, for at most `timeout_s`. 5xx and 429
    answers and refused connections are retried; any other status ends the wait at once (the
    router will not serve this request however long it runs), as does the router exiting."""
    started = time.monotonic()
    deadline = started + timeout_s
    refusals: dict[str, None] = {}
    attempts = 0
    while True:
        attempts += 1
        try:
            with urllib.request.urlopen(
                completion_request(base_url, model, api), timeout=max(1.0, interval_s * 10)
            ) as resp:
                resp.read()
                return Served(time.monotonic() - started, attempts, tuple(refusals))
        except urllib.error.HTTPError as e:
            refusal = _refusal(e.code, e.read())
            refusals.setdefault(refusal)
            if e.code not in RETRIED_STATUSES:
                raise NotServing(f"{base_url} refused a completion: {refusal}") from None
        except (urllib.error.URLError, OSError) as e:
            refusals.setdefault(f"no answer ({getattr(e, 'reason', e)})")
        if not alive():
            raise NotServing(f"{base_url}: the router exited before serving a completion")
        if time.monotonic() + interval_s > deadline:
            said = "; ".join(refusals) or "nothing"
            raise NotServing(
                f"{base_url} served no completion in {timeout_s:.0f} s ({attempts} tries): {said}"
            )
        time.sleep(interval_s)

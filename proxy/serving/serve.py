"""Serving the proxy from settings (`fleet-proxy serve`, and `fleet-proxy demo` over its
simulated fleet): the start-up banner, the warnings an exposed listener gets, and the server.
"""

from __future__ import annotations

import logging
import sys

from fleet.log_setup import configure_logging
from proxy.settings import Settings
from proxy.url_policy import listens_on_loopback


def banner(settings: Settings, port: int, model: str = "<model>") -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    base = f"http://{host}:{port}/v1"
    return (
        f"fleet-proxy listening: base_url = {base}\n"
        f"try:  curl -s {base}/models\n"
        f"      curl -s {base}/completions -H 'content-type: application/json' "
        + '-d \'{"model": "'
        + model
        + '", "prompt": "Hello", "max_tokens": 16}\''
    )


def exposure_warnings(settings: Settings) -> list[str]:
    """What an operator listening beyond loopback should know at start-up."""
    if listens_on_loopback(settings.host):
        return []
    out: list[str] = []
    if settings.admin_token is None:
        out.append(
            f"listening on {settings.host} with no admin_token: the admin API is off (403 to "
            "every client); set admin_token (FLEET_PROXY_ADMIN_TOKEN or --admin-token) to "
            "manage the fleet"
        )
    if not settings.api_keys and settings.api_keys_file is None:
        out.append(
            f"listening on {settings.host} with no api_keys: anyone who reaches this port can "
            "use the backends; set api_keys or api_keys_file to require a client key"
        )
    if settings.debug_receipts:
        out.append(
            f"listening on {settings.host} with debug_receipts on: any client can read routing "
            "scores and backend names with x-fleet-debug: 1"
        )
    if settings.error_details:
        out.append(
            f"listening on {settings.host} with error_details on: clients see backend ids "
            "and their error text"
        )
    return out


def run_serve(settings: Settings, model: str = "<model>") -> int:

    from policies.registry import UnknownPolicy
    from proxy.serving.app import create_app
    from proxy.serving.front_door import AnnouncingServer, fit_open_files, uvicorn_config

    configure_logging(settings.log_level)
    try:
        app = create_app(settings)
    except (UnknownPolicy, ValueError) as e:
        print(f"fleet-proxy: {e}", file=sys.stderr)
        return 2
    log = logging.getLogger("fleet_proxy")
    if not settings.backends:
        log.warning("no backends configured: add them with --backend URL or POST /admin/backends")
    for warning in exposure_warnings(settings):
        log.warning(warning)
    if settings.workers > 1:
        from proxy.serving.workers import run_workers

        return run_workers(settings, lambda port: banner(settings, port, model))
    fit_open_files(settings.client_max_connections)
    # The banner only once the port is bound, with the port bound.
    server = AnnouncingServer(
        uvicorn_config(app, settings),
        lambda port: print(banner(settings, port, model), flush=True),
        settings.shutdown_grace_period,
        app.core,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    except SystemExit:
        # uvicorn's way out when the app or the socket fails at start-up; said below.
        if server.started:
            raise
    if server.started:
        return 0
    print(
        f"fleet-proxy: not serving: could not start on {settings.host}:{settings.port} "
        "(the error above says why)",
        file=sys.stderr,
    )
    # As uvicorn.run: 3 when the app or the socket failed at start-up.
    return 3

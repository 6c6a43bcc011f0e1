"""`KubeApi` over kubernetes-asyncio (async throughout: the blocking official client is never
called from the event loop).

Responses are read raw (`_preload_content=False`) and turned into our own types, so only the
fields we use need to be there. `kube_api(...)` builds one from a kubeconfig file, the
in-cluster service account, or a plain base URL (tests, `kubectl proxy`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio import client, config

from fleet.kube import Gone, PodList, ScaleKind, ScaleTarget, WatchEvent, pod_from_json, watch_event
from fleet.kube_resources import ResourceEvent, resource_event

T = TypeVar("T")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MERGE_PATCH = "application/merge-patch+json"


def in_cluster_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace this pod runs in, or None outside a cluster."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {body[:300]}")
        self.status = status


async def _watch_lines(resp: Any, decode: Callable[[Any], T]) -> AsyncIterator[T]:
    """The events of a raw watch response, one JSON object a line; `Gone` or `ApiError` when
    the server refused the watch. The response is released however the iteration ends."""
    try:
        if resp.status != 200:
            await _json(resp)  # raises Gone or ApiError
        while line := await resp.content.readline():
            if line.strip():
                yield decode(json.loads(line))
    finally:
        resp.release()


async def _json(resp: Any) -> Any:
    """The body of a raw response, or `ApiError`/`Gone` for an error status."""
    try:
        if resp.status == 410:
            raise Gone(await resp.text())
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, await resp.text())
        return await resp.json(content_type=None)
    finally:
        resp.release()


class KubernetesAsyncApi:
    """`KubeApi` on a kubernetes-asyncio `ApiClient` (the caller closes it)."""

    def __init__(self, api: client.ApiClient) -> None:
        # Any: the client's stubs type the parsed models, not the raw responses read here, and
        # leave out `_content_type`, which the client takes.
        self.core: Any = client.CoreV1Api(api)
        self.apps: Any = client.AppsV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    async def get_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        """One namespaced custom resource as the API returns it (an InferencePool, say)."""
        obj: dict[str, Any] = await _json(
            await self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _preload_content=False
            )
        )
        return obj

    async def list_custom_objects(
        self, group: str, version: str, namespace: str, plural: str
    ) -> tuple[list[dict[str, Any]], str]:
        """A namespace's custom resources of one kind, and the list's resourceVersion."""
        data = await _json(
            await self.custom.list_namespaced_custom_object(
                group, version, namespace, plural, _preload_content=False
            )
        )
        version_now = str((data.get("metadata") or {}).get("resourceVersion", ""))
        return list(data.get("items") or []), version_now

    async def watch_custom_objects(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        resource_version: str,
        timeout_s: int,
    ) -> AsyncIterator[ResourceEvent]:
        """Changes to a namespace's custom resources of one kind after `resource_version`,
        until the server ends the watch at `timeout_s`; `Gone` when that version is too old."""
        resp = await self.custom.list_namespaced_custom_object(
            group,
            version,
            namespace,
            plural,
            watch="true",
            resource_version=resource_version,
            allow_watch_bookmarks="true",
            timeout_seconds=timeout_s,
            _request_timeout=timeout_s + 30,
            _preload_content=False,
        )
        async for event in _watch_lines(resp, resource_event):
            yield event

    async def get_scale(self, namespace: str, target: ScaleTarget) -> int:
        read = (
            self.apps.read_namespaced_deployment_scale
            if target.kind is ScaleKind.DEPLOYMENT
            else self.apps.read_namespaced_stateful_set_scale
        )
        scale = await _json(await read(target.name, namespace, _preload_content=False))
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def set_scale(self, namespace: str, target: ScaleTarget, replicas: int) -> None:
        patch = (
            self.apps.patch_namespaced_deployment_scale
            if target.kind is ScaleKind.DEPLOYMENT
            else self.apps.patch_namespaced_stateful_set_scale
        )
        body = {"spec": {"replicas": replicas}}
        await _json(
            await patch(
                target.name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
            )
        )

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        data = await _json(
            await self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            )
        )
        version = str((data.get("metadata") or {}).get("resourceVersion", ""))
        return PodList([pod_from_json(p) for p in data.get("items") or []], version)

    async def watch_pods(
        self, namespace: str, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        resp = await self.core.list_namespaced_pod(
            namespace,
            label_selector=selector,
            # Lower-case, as the API documents them; the client would send Python's "True".
            watch="true",
            resource_version=resource_version,
            allow_watch_bookmarks="true",
            timeout_seconds=timeout_s,
            # The server ends the watch at timeout_s; a dead connection is cut a bit later.
            _request_timeout=timeout_s + 30,
            _preload_content=False,
        )
        async for event in _watch_lines(resp, watch_event):
            yield event

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        await _json(
            await self.core.patch_namespaced_pod(
                name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
            )
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await _json(
                await self.core.delete_namespaced_pod(name, namespace, _preload_content=False)
            )
        except ApiError as e:
            if e.status != 404:  # already gone is what was wanted
                raise


@contextlib.asynccontextmanager
async def kube_api(
    *, kubeconfig: Path | None = None, base_url: str | None = None
) -> AsyncIterator[KubernetesAsyncApi]:
    """A `KubeApi`: at `base_url` without credentials when given, else from `kubeconfig`, else
    the in-cluster service account, else the default kubeconfig (~/.kube/config)."""
    conf = client.Configuration()
    if base_url is not None:
        conf.host = base_url.rstrip("/")
    elif kubeconfig is not None:
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    elif in_cluster_namespace() is not None:
        config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(client_configuration=conf)
    async with client.ApiClient(configuration=conf) as api:
        yield KubernetesAsyncApi(api)

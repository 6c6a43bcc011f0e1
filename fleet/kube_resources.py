"""Custom resources (an InferencePool, InferenceObjectives) followed with a list, then a
watch: the watch's events parsed, and the loop that keeps a `ResourceSink` current.

When the watch cannot be had (the API refuses it, the connection breaks), the loop lists
again every `retry_s`: polling is the fallback, never the rule."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.kube import Gone, watch_line

log = logging.getLogger("fleet_proxy.discovery")

# Seconds the server keeps one watch open before it is started again.
WATCH_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True)
class ResourceEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    resource_version: str
    object: Mapping[str, Any] = field(default_factory=dict)


def resource_event(raw: Mapping[str, Any]) -> ResourceEvent:
    """One line of a custom resources' watch stream (see `watch_line`)."""
    return ResourceEvent(*watch_line(raw))


class ResourceApi(Protocol):
    async def list_custom_objects(
        self, group: str, version: str, namespace: str, plural: str
    ) -> tuple[list[dict[str, Any]], str]: ...

    def watch_custom_objects(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        resource_version: str,
        timeout_s: int,
    ) -> AsyncIterator[ResourceEvent]: ...


class ResourceSink(Protocol):
    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Everything listed now."""

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED event."""


@dataclass(frozen=True, slots=True)
class ResourceKind:
    group: str
    version: str
    plural: str


async def follow_resources(
    api: ResourceApi,
    kind: ResourceKind,
    namespace: str,
    sink: ResourceSink,
    retry_s: float,
    watch_timeout_s: int = WATCH_TIMEOUT_S,
) -> None:
    """Keeps `sink` current with `namespace`'s resources of `kind`: a list, then a watch from
    the list's version, watched again from the last version seen when the server ends it,
    listed again after `Gone`; after any other failure, listed again `retry_s` later. Until
    cancelled."""
    what = f"{kind.plural} in {namespace}"
    version: str | None = None
    last_failure = ""  # said once at warning level, while it repeats at debug
    while True:
        try:
            if version is None:
                items, version = await api.list_custom_objects(
                    kind.group, kind.version, namespace, kind.plural
                )
                sink.replace(items)
            seen = 0
            async for event in api.watch_custom_objects(
                kind.group, kind.version, namespace, kind.plural, version, watch_timeout_s
            ):
                seen += 1
                if event.resource_version:
                    version = event.resource_version
                if event.type != "BOOKMARK":
                    sink.apply(event.type, event.object)
            if seen == 0:
                # Ended with nothing to say: not in a tight loop against a server that
                # closes watches at once.
                await asyncio.sleep(retry_s)
        except asyncio.CancelledError:
            raise
        except Gone:
            version = None
        except Exception as e:
            failure = str(e)
            level = logging.DEBUG if failure == last_failure else logging.WARNING
            log.log(level, "watching %s: %s; listing again in %gs", what, failure, retry_s)
            last_failure = failure
            version = None
            await asyncio.sleep(retry_s)

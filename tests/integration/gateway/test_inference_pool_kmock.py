"""The picker of an InferencePool: `--pool-name` reads the pool from the Kubernetes API (kmock,
an emulated API on 127.0.0.1), and its engines are the Ready pods of the pool's selector,
found by pod discovery, on the pool's target port unless a pod's annotation names another.

kmock ignores label selectors (tests/integration/test_kube_kmock.py): the test checks the
selector the picker asks with, and that the pods it lists become engines it picks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import kmock
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from proxy.gateway.objectives import FixedPriorities
from proxy.gateway.options import EppOptions
from proxy.gateway.shedding import OBJECTIVE_HEADER, Shedding
from proxy.serving.epp import running_epp
from simulator.fleet import start_fleet
from tests.integration.gateway.test_ext_proc_stream import (
    body_message,
    exchange,
    headers_message,
    pick_once,
)
from tests.integration.test_discovery_kmock import kube, kubeconfig
from tests.support.polling import eventually
from tests.support.servers import fast_settings

NS = "llm"
POOLS = f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools"
OBJECTIVES = f"/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{NS}/inferenceobjectives"
PODS = f"/api/v1/namespaces/{NS}/pods"
MODEL = "sim-llama-8b"

pytestmark = pytest.mark.slow


def pool(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm", "tier": "gpu"}},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "fleet-proxy-epp", "port": {"number": 9002}},
        },
    }


def pod(name: str, port: int | None) -> dict[str, Any]:
    annotations = {} if port is None else {"fleet-proxy.io/port": str(port)}
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"app": "vllm", "tier": "gpu"},
            "annotations": annotations,
        },
        "status": {
            "podIP": "127.0.0.1",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.fixture
async def emulator() -> AsyncIterator[str]:
    async with kmock.KubernetesEmulator() as k, kmock.Server(k, host="127.0.0.1") as srv:
        k.resources["v1/pods"] = {}
        k.resources["inference.networking.k8s.io/v1/inferencepools"] = {}
        k.resources["inference.networking.x-k8s.io/v1alpha2/inferenceobjectives"] = {}
        yield str(srv.url).rstrip("/")


async def test_the_pools_pods_become_the_pickers_engines(emulator: str, tmp_path: Path) -> None:
    base = emulator
    async with await start_fleet(2, speed=20.0) as fleet:
        port1, port2 = (urlsplit(u).port or 0 for u in fleet.urls)
        await kube("POST", base + POOLS, pool("vllm-pool", port1))
        # p1 on the pool's target port, p2 on its own annotated port.
        await kube("POST", base + PODS, pod("p1", None))
        await kube("POST", base + PODS, pod("p2", port2))
        settings = fast_settings([], discovery_kubeconfig=kubeconfig(tmp_path, base))
        options = EppOptions(port=0, pool_name="vllm-pool", pool_namespace=NS)
        async with running_epp(settings, options) as epp:
            core = epp.core
            await eventually(
                lambda: len(core.fleet.candidates(MODEL, core.clock.now())) == 2,
                within=30,
                what="both pods' engines scraped",
            )
            assert {b.id: b.url for b in core.fleet} == {
                "p1": fleet.urls[0],
                "p2": fleet.urls[1],
            }
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            answer = await pick_once(epp.port, body)
            assert answer.WhichOneof("response") == "request_body"


async def test_a_pool_without_a_selector_stops_start_up(emulator: str, tmp_path: Path) -> None:
    base = emulator
    broken = pool("broken", 8000)
    del broken["spec"]["selector"]
    await kube("POST", base + POOLS, broken)
    settings = fast_settings([], discovery_kubeconfig=kubeconfig(tmp_path, base))
    options = EppOptions(port=0, pool_name="broken", pool_namespace=NS)
    with pytest.raises(ValueError, match="matchLabels"):
        async with running_epp(settings, options):
            pass


async def test_a_change_of_the_pools_port_moves_its_engines(emulator: str, tmp_path: Path) -> None:
    """The pool is read again: its pods, on the new target port, replace the old engines."""
    base = emulator
    async with await start_fleet(2, speed=20.0) as fleet:
        port1, port2 = (urlsplit(u).port or 0 for u in fleet.urls)
        await kube("POST", base + POOLS, pool("vllm-pool", port1))
        await kube("POST", base + PODS, pod("p1", None))
        settings = fast_settings([], discovery_kubeconfig=kubeconfig(tmp_path, base))
        options = EppOptions(port=0, pool_name="vllm-pool", pool_namespace=NS, pool_poll_s=0.1)
        async with running_epp(settings, options) as epp:
            core = epp.core

            def p1_at(url: str) -> bool:
                backend = core.fleet.get("p1")
                return (
                    backend is not None
                    and backend.url == url
                    and bool(core.fleet.candidates(MODEL, core.clock.now()))
                )

            await eventually(lambda: p1_at(fleet.urls[0]), within=30, what="p1 on port 1")
            await kube(
                "PATCH", base + POOLS + "/vllm-pool", {"spec": {"targetPorts": [{"number": port2}]}}
            )
            await eventually(lambda: p1_at(fleet.urls[1]), within=30, what="p1 on port 2")
            answer = await pick_once(epp.port, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            picked = (
                answer.dynamic_metadata.fields["envoy.lb"]
                .struct_value.fields["x-gateway-destination-endpoint"]
                .string_value
            )
            assert picked == f"127.0.0.1:{port2}"


async def test_a_change_of_the_pool_arrives_by_the_watch(emulator: str, tmp_path: Path) -> None:
    """With a poll an hour apart, only the watch can bring the new port in time."""
    base = emulator
    async with await start_fleet(2, speed=20.0) as fleet:
        port1, port2 = (urlsplit(u).port or 0 for u in fleet.urls)
        await kube("POST", base + POOLS, pool("vllm-pool", port1))
        await kube("POST", base + PODS, pod("p1", None))
        settings = fast_settings([], discovery_kubeconfig=kubeconfig(tmp_path, base))
        options = EppOptions(port=0, pool_name="vllm-pool", pool_namespace=NS, pool_poll_s=3600)
        async with running_epp(settings, options) as epp:
            core = epp.core

            def p1_at(url: str) -> bool:
                backend = core.fleet.get("p1")
                return backend is not None and backend.url == url

            await eventually(lambda: p1_at(fleet.urls[0]), within=30, what="p1 on port 1")
            await kube(
                "PATCH", base + POOLS + "/vllm-pool", {"spec": {"targetPorts": [{"number": port2}]}}
            )
            await eventually(lambda: p1_at(fleet.urls[1]), within=30, what="p1 on port 2")


def objective(name: str, priority: int | None, pool_name: str = "vllm-pool") -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool_name}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


async def answer_for(port: int, objective_name: str) -> str:
    """ "shed" (429) or "picked" for a completion of the objective, on a saturated pool."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        headers = headers_message("/v1/completions", **{OBJECTIVE_HEADER: objective_name})
        body = body_message({"model": MODEL, "prompt": "hi", "max_tokens": 2})
        _, answer = await exchange(stub, headers, body)
    if answer.WhichOneof("response") == "immediate_response":
        assert answer.immediate_response.status.code == 429
        return "shed"
    assert answer.WhichOneof("response") == "request_body"
    return "picked"


async def test_the_pools_objectives_decide_which_requests_are_shed(
    emulator: str, tmp_path: Path
) -> None:
    """InferenceObjectives of the pool, watched: a negative priority sheds the objective's
    requests when the pool is saturated (a queue depth of 0 saturates every engine); a
    priority raised, an objective deleted or one of another pool is not shed; a priority given
    on the command line wins over the cluster's."""
    base = emulator
    async with await start_fleet(1, speed=20.0) as fleet:
        await kube("POST", base + POOLS, pool("vllm-pool", urlsplit(fleet.urls[0]).port or 0))
        await kube("POST", base + PODS, pod("p1", None))
        await kube("POST", base + OBJECTIVES, objective("batch", -1))
        await kube("POST", base + OBJECTIVES, objective("chat", None))
        await kube("POST", base + OBJECTIVES, objective("other-pools", -5, pool_name="elsewhere"))
        await kube("POST", base + OBJECTIVES, objective("pinned", -3))
        settings = fast_settings([], discovery_kubeconfig=kubeconfig(tmp_path, base))
        shedding = Shedding(queue_depth=0, priorities=FixedPriorities({"pinned": 1}))
        options = EppOptions(
            port=0, pool_name="vllm-pool", pool_namespace=NS, pool_poll_s=3600, shedding=shedding
        )
        async with running_epp(settings, options) as epp:
            core = epp.core
            await eventually(
                lambda: bool(core.fleet.candidates(MODEL, core.clock.now())),
                within=30,
                what="the pod's engine scraped",
            )

            async def answers_are(expected: dict[str, str]) -> bool:
                return {n: await answer_for(epp.port, n) for n in expected} == expected

            everyone = dict.fromkeys(
                ("batch", "chat", "other-pools", "pinned", "unknown"), "picked"
            )
            await eventually(
                lambda: answers_are({**everyone, "batch": "shed"}),
                within=30,
                every=0.1,
                what="batch shed, the rest picked",
            )
            await kube("PATCH", base + OBJECTIVES + "/chat", {"spec": {"priority": -2}})
            await eventually(
                lambda: answers_are({**everyone, "batch": "shed", "chat": "shed"}),
                within=30,
                every=0.1,
                what="chat shed too",
            )
            await kube("PATCH", base + OBJECTIVES + "/batch", {"spec": {"priority": 4}})
            await kube("DELETE", base + OBJECTIVES + "/chat", None)
            await eventually(
                lambda: answers_are(everyone), within=30, every=0.1, what="neither shed any more"
            )


async def test_without_watches_the_pool_and_objectives_are_polled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An API that refuses every watch (403, as RBAC without `watch` does): the pool is read
    again, and the objectives listed again, every `--pool-poll-seconds`."""
    async with kmock.KubernetesEmulator() as k, kmock.Server(k, host="127.0.0.1") as srv:
        k.resources["v1/pods"] = {}
        k.resources["inference.networking.k8s.io/v1/inferencepools"] = {}
        k.resources["inference.networking.x-k8s.io/v1alpha2/inferenceobjectives"] = {}
        base = str(srv.url).rstrip("/")
        refused = ("inferencepools", "inferenceobjectives")
        (
            k[
                lambda req: (
                    req.params.get("watch") == "true" and req.url.path.split("/")[-1] in refused
                )
            ]
            << 403
        )
        async with await start_fleet(2, speed=20.0) as fleet:
            port1, port2 = (urlsplit(u).port or 0 for u in fleet.urls)
            await kube("POST", base + POOLS, pool("vllm-pool", port1))
            await kube("POST", base + PODS, pod("p1", None))
            settings = fast_settings([], discovery_kubeconfig=kubeconfig(tmp_path, base))
            options = EppOptions(
                port=0,
                pool_name="vllm-pool",
                pool_namespace=NS,
                pool_poll_s=0.2,
                shedding=Shedding(queue_depth=0),
            )
            async with running_epp(settings, options) as epp:
                core = epp.core

                def p1_at(url: str) -> bool:
                    backend = core.fleet.get("p1")
                    return (
                        backend is not None
                        and backend.url == url
                        and bool(core.fleet.candidates(MODEL, core.clock.now()))
                    )

                await eventually(lambda: p1_at(fleet.urls[0]), within=30, what="p1 on port 1")
                await kube(
                    "PATCH",
                    base + POOLS + "/vllm-pool",
                    {"spec": {"targetPorts": [{"number": port2}]}},
                )
                await eventually(lambda: p1_at(fleet.urls[1]), within=30, what="p1 on port 2")
                assert await answer_for(epp.port, "batch") == "picked"
                await kube("POST", base + OBJECTIVES, objective("batch", -1))

                async def batch_shed() -> bool:
                    return await answer_for(epp.port, "batch") == "shed"

                await eventually(batch_shed, within=30, every=0.1, what="batch shed")
            # Both watches were tried, refused, and fell back to reading again.
            for plural in refused:
                assert f"watching {plural} in {NS}: Kubernetes API answered 403" in caplog.text

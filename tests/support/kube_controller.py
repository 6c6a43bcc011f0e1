"""The Kubernetes controllers an emulated API server lacks, played over its HTTP API for one
Deployment: pods up to spec.replicas (created not Ready, made Ready on the next step), and on a
scale-down the pod of lowest `pod-deletion-cost` removed first, as the ReplicaSet controller
does. `step()` is one reconciliation; `run()` repeats it until cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from fleet.kube import DELETION_COST


class ReplicaSetController:
    def __init__(self, session: aiohttp.ClientSession, base: str, namespace: str,
                 deployment: str, labels: dict[str, str]) -> None:  # fmt: skip
        self.session = session
        self.deployment = f"{base}/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}"
        self.pods = f"{base}/api/v1/namespaces/{namespace}/pods"
        self.namespace = namespace
        self.name = deployment
        self.labels = labels
        self.made = 0
        self.deleted: list[str] = []

    async def _get(self, url: str) -> Any:
        async with self.session.get(url) as r:
            r.raise_for_status()
            return await r.json()

    async def step(self) -> None:
        want = int((await self._get(self.deployment))["spec"]["replicas"])
        pods = [p for p in (await self._get(self.pods))["items"]
                if p["metadata"]["name"].startswith(self.name + "-")]  # fmt: skip
        for p in pods:
            if not p.get("status", {}).get("conditions"):
                ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
                url = f"{self.pods}/{p['metadata']['name']}"
                async with self.session.patch(url, json=ready) as r:
                    r.raise_for_status()
        for _ in range(want - len(pods)):
            self.made += 1
            name = f"{self.name}-{self.made}"
            pod = {
                "metadata": {"name": name, "namespace": self.namespace, "labels": self.labels},
                "status": {"podIP": f"10.0.0.{self.made}", "phase": "Running"},
            }
            async with self.session.post(self.pods, json=pod) as r:
                r.raise_for_status()

        def cost(p: dict[str, Any]) -> int:
            return int((p["metadata"].get("annotations") or {}).get(DELETION_COST, "0"))

        for p in sorted(pods, key=cost)[: max(0, len(pods) - want)]:
            name = p["metadata"]["name"]
            async with self.session.delete(f"{self.pods}/{name}") as r:
                r.raise_for_status()
            self.deleted.append(name)

    async def run(self, period_s: float = 0.02) -> None:
        while True:
            await self.step()
            await asyncio.sleep(period_s)

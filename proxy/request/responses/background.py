"""The background responses this process runs (`background: true`): their tasks, by response
id. Their results go to the store, which every replica reads; the tasks themselves live only
here, so a replica that stops takes its running ones with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class BackgroundRuns:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, response_id: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=f"response {response_id}")
        self._tasks[response_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(response_id, None))
        return task

    def cancel(self, response_id: str) -> bool:
        """Stop the response's task; False when this process runs no such task."""
        task = self._tasks.pop(response_id, None)
        if task is None:
            return False
        task.cancel()
        return True

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

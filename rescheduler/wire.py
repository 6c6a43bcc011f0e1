"""A ClusterView as JSON, for the admin API and a standalone rescheduler reading it back."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from rescheduler.view import ClusterView

_VIEW = TypeAdapter(ClusterView)


def view_to_json(view: ClusterView) -> dict[str, Any]:
    out: dict[str, Any] = _VIEW.dump_python(view, mode="json")
    return out


def view_from_json(data: Any) -> ClusterView:
    """Validated (a pydantic ValidationError, a ValueError, when it is not a view)."""
    return _VIEW.validate_python(data)

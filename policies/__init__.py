"""Routing policies: pure functions of (request context, candidate backends) -> Decision."""

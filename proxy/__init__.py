"""The OpenAI-compatible front door: settings, app factory, forwarding, admin API and CLI."""

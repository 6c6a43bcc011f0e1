"""Server-sent event bytes the proxy looks for or writes: one definition for every reader."""

from __future__ import annotations

# The end of an OpenAI-style stream.
DONE_EVENT = b"data: [DONE]\n\n"
# How an OpenAI-style error event starts (vLLM sends one when it gives up mid-stream).
ERROR_EVENT_START = b'data: {"error"'

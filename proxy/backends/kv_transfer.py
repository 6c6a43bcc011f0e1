"""NixlConnector's `kv_transfer_params` for the prefill leg of a prefill/decode pair: the
engine computes the prompt's KV, keeps it for a remote decoder to pull, and answers with the
params the decode leg passes on. Standard library only, so the real-vLLM scripts (run by
interpreters without this project's dependencies) import it too."""

from __future__ import annotations

from typing import Any


def remote_decode_params() -> dict[str, Any]:
    """A fresh copy: callers put it into request bodies they may change."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }

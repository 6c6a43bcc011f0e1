"""Speech-to-text as `vllm serve` answers it for an audio model: `/v1/audio/transcriptions`
and `/v1/audio/translations`, multipart/form-data uploads with a `file` part.

The engine does not listen to the audio: it reads the upload to its end (as vLLM does before
decoding it), counts its bytes, and answers with text derived from them. Answer shapes are
vLLM's: `{"text", "usage": {"type": "duration", "seconds"}}` for a transcription, `{"text"}`
for a translation, plain text for `response_format=text`, and with `stream=true` a
`transcription.chunk` (`translation.chunk`) event per word, a last one with its
finish_reason, a usage event when `stream_include_usage` is set, then `[DONE]`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

# The byte rate of 16 kHz 16-bit mono PCM, the audio a duration is derived from here.
_BYTES_PER_SECOND = 32_000
_TRUE = frozenset({"true", "1", "yes", "on"})


@dataclass(slots=True)
class AudioRequest:
    """What an upload's form fields asked for, and how large its file was."""

    task: str  # "transcription" or "translation"
    fields: dict[str, str] = field(default_factory=dict)
    file_bytes: int = 0
    has_file: bool = False

    @property
    def model(self) -> str | None:
        return self.fields.get("model")

    @property
    def stream(self) -> bool:
        return self.fields.get("stream", "").lower() in _TRUE

    @property
    def include_usage(self) -> bool:
        return self.fields.get("stream_include_usage", "").lower() in _TRUE

    @property
    def response_format(self) -> str:
        return self.fields.get("response_format", "json")

    @property
    def seconds(self) -> int:
        return max(1, self.file_bytes // _BYTES_PER_SECOND)

    def words(self) -> list[str]:
        verb = "transcribed" if self.task == "transcription" else "translated"
        return ["simulated", verb, "audio", "of", str(self.file_bytes), "bytes"]

    def text(self) -> str:
        return " ".join(self.words())


def whole_answer(req: AudioRequest) -> dict[str, Any]:
    if req.task == "translation":
        return {"text": req.text()}
    return {"text": req.text(), "usage": {"type": "duration", "seconds": req.seconds}}


def stream_events(req: AudioRequest, model: str) -> list[dict[str, Any]]:
    """The events of a streamed answer, before its [DONE]."""
    rid = f"trsc-{uuid.uuid4().hex}"
    created = int(time.time())
    obj = f"{req.task}.chunk"

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": rid, "object": obj, "created": created, "model": model, "choices": choices,
        }  # fmt: skip
        if usage is not None:
            out["usage"] = usage
        return out

    words = req.words()
    events = [
        event([{"delta": {"content": (" " if i else "") + w}, "finish_reason": None,
                "stop_reason": None}])
        for i, w in enumerate(words)
    ]  # fmt: skip
    events.append(event([{"delta": {"content": ""}, "finish_reason": "stop", "stop_reason": None}]))
    if req.include_usage:
        # vLLM counts the audio's encoder tokens as the prompt.
        prompt = req.seconds * 50
        events.append(
            event([], {"prompt_tokens": prompt, "completion_tokens": len(words),
                       "total_tokens": prompt + len(words)})
        )  # fmt: skip
    return events

"""Reading TensorBoard event files back: TFRecord framing (length, its CRC, the record, its
CRC) around `Event` protocol buffers, parsed with tensorboardX's own generated classes."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event


def read_events(log_dir: Path) -> list[Event]:
    events: list[Event] = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            record = data[at + 12 : at + 12 + length]
            events.append(Event.FromString(record))
            at += 12 + length + 4
    return events


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] in file order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for e in read_events(log_dir):
        for v in e.summary.value:
            if v.HasField("simple_value"):
                out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def texts(log_dir: Path) -> dict[str, list[str]]:
    """tag -> the text summaries written under it (tensorboardX adds a `/text_summary`)."""
    out: dict[str, list[str]] = {}
    for e in read_events(log_dir):
        for v in e.summary.value:
            if v.HasField("tensor") and v.tensor.string_val:
                tag = v.tag.removesuffix("/text_summary")
                out.setdefault(tag, []).extend(s.decode() for s in v.tensor.string_val)
    return out

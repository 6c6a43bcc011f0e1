"""The SLA profile file: what `fleet-proxy profile-sla` measures and the planner's SLA mode
reads. JSON, validated on load (pydantic), so a hand-edited or truncated file fails with the
field at fault rather than a KeyError deep in the arithmetic.

    {"format": "fleet-proxy-sla-profile/1",
     "sla": {"isl": 3000, "osl": 150, "ttft": 0.2, "itl": 0.02},   # what it was profiled for
     "chosen_prefill": "tp1",      # the config the SLA mode plans prefill workers with
     "chosen_decode": "tp1",       # and decode workers with (chosen apart, as each role's
                                   # best throughput per GPU may come from a different config)
     "configs": [
       {"name": "tp1", "num_gpu": 1,
        "prefill": {"points": [[isl, ttft_seconds], ...]},         # sorted by isl
        "decode": {"kv_tokens": 65536,                             # KV capacity (null: unknown)
                   "curves": [[context, [[in_flight, itl_seconds], ...]], ...]}}]}

Every configuration profiled is kept, so the plots and a later re-choice need no re-run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.sla import DecodeGrid, PrefillCurve

FORMAT = "fleet-proxy-sla-profile/1"

_Point = tuple[float, float]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlaTarget(_Strict):
    isl: float = Field(gt=0)
    osl: float = Field(gt=0)
    ttft: float = Field(gt=0)  # seconds
    itl: float = Field(gt=0)  # seconds


class PrefillData(_Strict):
    points: tuple[_Point, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> PrefillData:
        xs = [x for x, _ in self.points]
        if xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ValueError("prefill points must be sorted by isl, without repeats")
        return self


class DecodeData(_Strict):
    kv_tokens: int | None = Field(default=None, gt=0)
    curves: tuple[tuple[float, tuple[_Point, ...]], ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> DecodeData:
        contexts = [c for c, _ in self.curves]
        if contexts != sorted(contexts) or len(set(contexts)) != len(contexts):
            raise ValueError("decode curves must be sorted by context, without repeats")
        for context, curve in self.curves:
            ns = [n for n, _ in curve]
            if not curve or ns != sorted(ns) or len(set(ns)) != len(ns):
                raise ValueError(f"decode curve at context {context}: sorted in_flight needed")
        return self


class ConfigProfile(_Strict):
    name: str = Field(min_length=1)
    num_gpu: int = Field(ge=1)
    prefill: PrefillData
    decode: DecodeData


class ProfileFile(_Strict):
    format: str = FORMAT
    sla: SlaTarget
    chosen_prefill: str
    chosen_decode: str
    configs: tuple[ConfigProfile, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _known(self) -> ProfileFile:
        if self.format != FORMAT:
            raise ValueError(f"format {self.format!r}: this version reads {FORMAT!r}")
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise ValueError(f"config names repeat: {names}")
        for role, chosen in (("prefill", self.chosen_prefill), ("decode", self.chosen_decode)):
            if chosen not in names:
                raise ValueError(f"chosen_{role} config {chosen!r} is not among {names}")
        return self

    def config(self, name: str) -> ConfigProfile:
        for c in self.configs:
            if c.name == name:
                return c
        have = [c.name for c in self.configs]
        raise KeyError(f"no config {name!r} in the profile (have {have})")


@dataclass(frozen=True, slots=True)
class SlaProfiles:
    """The prefill curve and decode grid the SLA arithmetic (planner/sla.py) reads, each from
    its chosen configuration, with that configuration's name and GPUs per engine."""

    prefill: PrefillCurve
    prefill_config: str
    prefill_num_gpu: int
    decode: DecodeGrid
    decode_config: str
    decode_num_gpu: int


def sla_profiles(
    data: ProfileFile, prefill_config: str | None = None, decode_config: str | None = None
) -> SlaProfiles:
    """The chosen configurations, or those named."""
    p = data.config(prefill_config or data.chosen_prefill)
    d = data.config(decode_config or data.chosen_decode)
    return SlaProfiles(
        prefill=PrefillCurve(p.prefill.points),
        prefill_config=p.name,
        prefill_num_gpu=p.num_gpu,
        decode=DecodeGrid(d.decode.curves, d.decode.kv_tokens),
        decode_config=d.name,
        decode_num_gpu=d.num_gpu,
    )


def read_profile_file(path: Path) -> ProfileFile:
    """The file, validated (ValueError naming the file and the fault)."""
    try:
        return ProfileFile.model_validate(orjson.loads(path.read_bytes()))
    except ValidationError as e:
        # One line per file, each fault with where it is: pydantic's own text spans lines.
        faults = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or 'file'}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"{path}: not a usable SLA profile: {faults}") from e
    except (OSError, orjson.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a usable SLA profile: {e}") from e


def load_profile(
    path: Path, prefill_config: str | None = None, decode_config: str | None = None
) -> SlaProfiles:
    """The chosen configurations (or those named) of the profile at `path`."""
    data = read_profile_file(path)
    try:
        return sla_profiles(data, prefill_config, decode_config)
    except KeyError as e:
        raise ValueError(f"{path}: {e.args[0]}") from e


def write_profile_file(path: Path, data: ProfileFile) -> None:
    """Written whole to a temporary name, then renamed: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    tmp.replace(path)

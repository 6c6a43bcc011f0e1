"""The SLA profile file: a round trip, and each malformed file refused with its fault named."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from planner.profile_file import (
    FORMAT,
    ConfigProfile,
    DecodeData,
    PrefillData,
    ProfileFile,
    SlaTarget,
    load_profile,
    read_profile_file,
    write_profile_file,
)


def _file(**over: object) -> dict[str, object]:
    data: dict[str, object] = {
        "format": FORMAT,
        "sla": {"isl": 1000, "osl": 100, "ttft": 0.5, "itl": 0.05},
        "chosen_prefill": "tp1",
        "chosen_decode": "tp2",
        "configs": [
            {
                "name": "tp1",
                "num_gpu": 1,
                "prefill": {"points": [[100, 0.05], [1000, 0.3]]},
                "decode": {"kv_tokens": 10000, "curves": [[500, [[1, 0.01], [32, 0.02]]]]},
            },
            {
                "name": "tp2",
                "num_gpu": 2,
                "prefill": {"points": [[100, 0.03], [1000, 0.2]]},
                "decode": {"kv_tokens": None, "curves": [[500, [[1, 0.008], [16, 0.02]]]]},
            },
        ],
    }
    data.update(over)
    return data


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "profile.json"
    path.write_bytes(orjson.dumps(data))
    return path


def test_round_trip_and_the_chosen_config_drives_the_arithmetic(tmp_path: Path) -> None:
    data = ProfileFile.model_validate(_file())
    path = tmp_path / "p.json"
    write_profile_file(path, data)
    assert read_profile_file(path) == data
    chosen = load_profile(path)
    assert (chosen.prefill_config, chosen.prefill_num_gpu) == ("tp1", 1)
    assert chosen.prefill.ttft(550) == pytest.approx(0.175)  # halfway between the points
    assert (chosen.decode_config, chosen.decode_num_gpu) == ("tp2", 2)
    assert chosen.decode.max_in_flight(500) == 16  # no KV size: the largest profiled count
    named = load_profile(path, prefill_config="tp2", decode_config="tp1")
    assert named.prefill.ttft(100) == pytest.approx(0.03)
    assert named.decode.max_in_flight(500) == 20  # 10000 KV tokens / 500, under the 32 profiled
    assert named.decode.max_in_flight(100) == 32  # the KV holds 100: no guessing past 32
    with pytest.raises(ValueError, match="tp7"):
        load_profile(path, decode_config="tp7")


def test_models_build_the_same_file() -> None:
    built = ProfileFile(
        sla=SlaTarget(isl=1000, osl=100, ttft=0.5, itl=0.05),
        chosen_prefill="tp1",
        chosen_decode="tp1",
        configs=(
            ConfigProfile(
                name="tp1",
                num_gpu=1,
                prefill=PrefillData(points=((100, 0.05), (1000, 0.3))),
                decode=DecodeData(kv_tokens=10000, curves=((500, ((1, 0.01), (8, 0.02))),)),
            ),
        ),
    )
    assert built.config("tp1").prefill.points[1] == (1000, 0.3)


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"format": "other/9"}, "format"),
        ({"chosen_prefill": "tp9"}, "tp9"),
        ({"chosen_decode": "tp8"}, "tp8"),
        ({"sla": {"isl": 0, "osl": 100, "ttft": 0.5, "itl": 0.05}}, "isl"),
        ({"configs": []}, "configs"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_malformed_files_are_refused_naming_the_fault(
    tmp_path: Path, change: dict[str, object], fault: str
) -> None:
    with pytest.raises(ValueError, match=fault):
        load_profile(_write(tmp_path, _file(**change)))


def test_unsorted_curves_are_refused(tmp_path: Path) -> None:
    data = _file()
    configs = data["configs"]
    assert isinstance(configs, list)
    configs[0]["prefill"] = {"points": [[1000, 0.3], [100, 0.05]]}
    with pytest.raises(ValueError, match="sorted by isl"):
        load_profile(_write(tmp_path, data))
    configs[0]["prefill"] = {"points": [[100, 0.05]]}
    configs[0]["decode"] = {"kv_tokens": 1, "curves": [[500, [[8, 0.02], [1, 0.01]]]]}
    with pytest.raises(ValueError, match="in_flight"):
        load_profile(_write(tmp_path, data))


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.json"):
        load_profile(path)
    with pytest.raises(ValueError, match=r"missing\.json"):
        load_profile(tmp_path / "missing.json")

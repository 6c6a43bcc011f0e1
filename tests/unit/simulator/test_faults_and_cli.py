import pytest

from simulator.cli import _fault_update, _profile, build_parser, main
from simulator.faults import FaultState, parse_fault_update
from simulator.profiles import available_profiles, load_profile


@pytest.mark.parametrize(
    "body",
    [
        {"error_rate": 2},
        {"slowdown": 0},
        {"hang": "yes"},
        {"stall_generation": 1},
        {"die_after_tokens": 0},
        {"bogus": 1},
        [1],
    ],
)
def test_bad_fault_updates_are_refused(body: object) -> None:
    with pytest.raises(ValueError):
        parse_fault_update(body)


def test_error_rate_is_reproducible_and_hang_gates_waiters() -> None:
    a, b = FaultState(), FaultState()
    a.apply({"error_rate": 0.5})
    b.apply({"error_rate": 0.5})
    seq = [a.should_error() for _ in range(200)]
    assert seq == [b.should_error() for _ in range(200)]
    assert 60 < sum(seq) < 140
    a.apply({"hang": True})
    assert not a.unhung.is_set()
    a.apply({"hang": False})
    assert a.unhung.is_set()


def test_stall_generation_gates_generation_only() -> None:
    f = FaultState()
    f.apply({"stall_generation": True})
    assert f.unhung.is_set() and not f.generating.is_set()
    f.apply({"hang": True})
    f.apply({"stall_generation": False})
    assert not f.generating.is_set()  # the hang still holds generation
    f.apply({"hang": False})
    assert f.unhung.is_set() and f.generating.is_set()


def test_cli_fault_flags_make_one_update() -> None:
    args = build_parser().parse_args(["--fault-stall-generation", "--fault-error-rate", "0.5"])
    assert _fault_update(args) == {"stall_generation": True, "error_rate": 0.5}
    assert _fault_update(build_parser().parse_args([])) == {}


def test_stream_limit_is_the_smaller_cut() -> None:
    f = FaultState()
    assert f.stream_limit() is None
    f.apply({"die_after_tokens": 9, "cut_stream_after_tokens": 4})
    assert f.stream_limit() == 4


def test_shipped_profiles_load() -> None:
    assert {"h100-llama-8b", "cpu-tiny"} <= set(available_profiles())
    for name in available_profiles():
        p = load_profile(name)
        assert p.num_gpu_blocks > 0 and p.step_time.duration(1, 0) > 0


def test_cli_defaults_and_rejections() -> None:
    args = build_parser().parse_args(["--engines", "3"])
    assert (args.profile, args.model, args.role, args.speed) == (
        "h100-llama-8b",
        "sim-llama-8b",
        "both",
        1.0,
    )
    assert main(["--profile", "no-such-profile"]) == 2
    assert main(["--engines", "0"]) == 2
    assert main(["--fault-error-rate", "3"]) == 2
    assert main(["--engines", "2", "--role", "prefill,decode,decode"]) == 2
    assert main(["--role", "router"]) == 2


def test_cli_num_gpu_blocks_overrides_the_profile_kv_cache() -> None:
    shipped = load_profile("h100-llama-8b")
    small = _profile(build_parser().parse_args(["--num-gpu-blocks", "64"]))
    assert small.num_gpu_blocks == 64 and shipped.num_gpu_blocks != 64
    assert small.with_overrides(num_gpu_blocks=shipped.num_gpu_blocks) == shipped
    assert _profile(build_parser().parse_args([])) == shipped
    assert main(["--num-gpu-blocks", "0"]) == 2

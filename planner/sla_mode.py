"""The loop's decision step per mode: `Decider` (protocol), `LoadDecider` (the load-based
rules), `SlaDecider` (the SLA mode with its predictors), and `decider_for(config)`.

`SlaDecider` keeps one predictor per series (request rate, ISL, OSL). At a due adjustment it
observes the interval's traffic, feeds it to the predictors (ISL and OSL only when requests
finished, so an idle interval does not read as zero-length requests), forecasts the next
interval off the event loop (a model fit takes milliseconds), and hands the forecast to the
pure `decide_sla`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from planner.config import PlannerConfig, PlannerMode, Topology
from planner.decide import Decision, PlannerState, decide, due_hold, interval
from planner.observe import Sample
from planner.predictors import make_predictor
from planner.profile_file import SlaProfiles, load_profile, read_profile_file
from planner.sla_decide import decide_sla
from planner.traffic import Forecast, observe_traffic


class Decider(Protocol):
    async def decide(
        self, history: Sequence[Sample], state: PlannerState, config: PlannerConfig, now: float
    ) -> Decision: ...


class LoadDecider:
    """The load-based rules (planner/decide.py)."""

    async def decide(
        self, history: Sequence[Sample], state: PlannerState, config: PlannerConfig, now: float
    ) -> Decision:
        return decide(history, state, config, now)


class SlaDecider:
    def __init__(self, config: PlannerConfig, profiles: SlaProfiles) -> None:
        self.profiles = profiles
        self.rate = make_predictor(config.load_predictor, config.load_predictor_window)
        self.isl = make_predictor(config.load_predictor, config.load_predictor_window)
        self.osl = make_predictor(config.load_predictor, config.load_predictor_window)

    async def decide(
        self, history: Sequence[Sample], state: PlannerState, config: PlannerConfig, now: float
    ) -> Decision:
        if due_hold(state, config, now) is None:
            traffic = observe_traffic(interval(history, state, now))
            if traffic is not None:
                self.rate.observe(traffic.rate)
                if traffic.isl is not None and traffic.osl is not None:
                    self.isl.observe(traffic.isl)
                    self.osl.observe(traffic.osl)
        forecast = await asyncio.to_thread(self.forecast)
        return decide_sla(history, state, config, self.profiles, forecast, now)

    def forecast(self) -> Forecast:
        return Forecast(self.rate.predict(), self.isl.predict(), self.osl.predict())


def profiles_for(config: PlannerConfig, path: Path) -> SlaProfiles:
    """The profile's chosen configurations; in an aggregated fleet both curves come from the
    decode configuration, the one its workers run."""
    if config.topology is Topology.AGGREGATED:
        chosen = read_profile_file(path).chosen_decode
        return load_profile(path, prefill_config=chosen, decode_config=chosen)
    return load_profile(path)


def check_profile(config: PlannerConfig, profiles: SlaProfiles) -> None:
    """ValueError when the workers would get other GPU counts than the profile measured."""
    errors = []
    roles = [
        ("decode", config.decode_engine_num_gpu, profiles.decode_num_gpu, profiles.decode_config)
    ]
    if config.topology is Topology.DISAGGREGATED:
        roles.append(
            (
                "prefill",
                config.prefill_engine_num_gpu,
                profiles.prefill_num_gpu,
                profiles.prefill_config,
            )
        )
    for role, set_to, measured, name in roles:
        if set_to != measured:
            errors.append(
                f"{role}_engine_num_gpu is {set_to} but the profile's {role} config "
                f"{name!r} uses {measured} GPUs per engine"
            )
    if errors:
        raise ValueError("SLA profile does not match the planner config: " + "; ".join(errors))


def decider_for(config: PlannerConfig, profiles: SlaProfiles | None = None) -> Decider:
    """The mode's decider; in SLA mode the profile is `profiles`, or read from
    `config.sla_profile` (ValueError naming a bad file or a GPU mismatch)."""
    if config.mode is PlannerMode.LOAD:
        return LoadDecider()
    if profiles is None:
        profiles = profiles_for(config, Path(config.sla_profile or ""))
    check_profile(config, profiles)
    return SlaDecider(config, profiles)

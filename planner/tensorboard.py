"""The planner's run as TensorBoard event files (tensorboardX's writer), for `tensorboard
--logdir DIR`:

- per metric pull (step: pulls so far): `sample/prefill_queue`, `sample/decode_kv`;
- per due decision (step: decisions so far), per role: `<role>/replicas` (after the change),
  `<role>/desired_replicas`, `<role>/interval_load` (the interval's mean), and the rule that
  decided as text, `<role>/reason`;
- per drain (step: drains so far): `drain/<role>/seconds`.
"""

from __future__ import annotations

from pathlib import Path

from tensorboardX import SummaryWriter

from planner.config import PlannerRole
from planner.decide import Decision, PlannerState
from planner.drain import DrainReport
from planner.observe import Sample


class TensorBoardEvents:
    def __init__(self, log_dir: Path, flush_secs: int = 10) -> None:
        self.writer = SummaryWriter(logdir=str(log_dir), flush_secs=flush_secs)
        self.samples = self.decisions = self.drains = 0

    def on_sample(self, sample: Sample) -> None:
        self.samples += 1
        for tag, value in (
            ("sample/prefill_queue", sample.prefill_queue),
            ("sample/decode_kv", sample.decode_kv),
        ):
            if value is not None:
                self.writer.add_scalar(tag, value, self.samples)

    def on_decision(self, decision: Decision, state: PlannerState, errors: tuple[str, ...]) -> None:
        self.decisions += 1
        step = self.decisions
        for r in decision.roles:
            self.writer.add_scalar(f"{r.role}/replicas", state.replicas(r.role), step)
            self.writer.add_scalar(f"{r.role}/desired_replicas", r.desired, step)
            if r.load is not None:
                self.writer.add_scalar(f"{r.role}/interval_load", r.load, step)
            self.writer.add_text(f"{r.role}/reason", r.reason.value, step)
        if errors:
            self.writer.add_text("errors", "; ".join(errors), step)

    def on_drain(self, role: PlannerRole, report: DrainReport) -> None:
        self.drains += 1
        self.writer.add_scalar(f"drain/{role}/seconds", report.waited_s, self.drains)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

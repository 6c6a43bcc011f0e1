"""The autoscaling planner's pure decision core: how many prefill and decode (or aggregated)
workers the fleet should have, from the load the proxy observes (docs/planner.md).

- `planner.config`: the settings and their validation;
- `planner.observe`: one metric pull -> `Sample`;
- `planner.decide`: the load-based rules, `decide(history, state, config, now) -> Decision`;
- `planner.sla`: the SLA arithmetic (replicas from a predicted load and profiled engines) and
  the load predictors.

Nothing here does I/O or reads a clock; the runtime (connectors, drain, run modes) comes next.
"""

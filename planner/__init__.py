"""The autoscaling planner's pure decision core: how many prefill and decode (or aggregated)
workers the fleet should have, from the load the proxy observes (docs/planner.md).

- `planner.config`: the settings and their validation;
- `planner.observe`: one metric pull -> `Sample`;
- `planner.decide`: the load-based rules, `decide(history, state, config, now) -> Decision`;
- `planner.sla`: the SLA arithmetic (replicas from a predicted load and profiled engines) and
  the load predictors.

Those are pure: no I/O, no clock. The runtime around them:

- `planner.connector`: `Connector`, how workers come and go (`FakeConnector` for tests);
- `planner.proxy_admin`: `ProxyAdmin`, the planner's client of the proxy's admin API;
- `planner.drain`: which worker to remove and how to drain it without cutting a request;
- `planner.local`: `LocalConnector`, workers as local processes;
- `planner.loop`: `PlannerLoop`, pull, decide, apply;
- `planner.events`, `planner.metrics`, `planner.tensorboard`: what the runtime reports, and
  where (status journal, Prometheus, TensorBoard files);
- `planner.assemble`, `planner.config_file`: one planner, built alike in both run modes;
- `planner.status_server`, `planner.standalone`: `fleet-proxy plan` and its `/metrics`.
- `planner.profile_sla`: `fleet-proxy profile-sla`, which measures engines
  (`planner.sla_measure`), chooses a configuration per role and suggests thresholds
  (`planner.sla_choice`, pure), and plots them (`planner.sla_plots`).
"""

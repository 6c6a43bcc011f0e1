"""Flow control at the gateway: who is asking (tenant, priority), whether a model's pool is
saturated, and which waiting request goes next. Pure decisions only: no I/O, clocks passed in;
the proxy's loop around them lives in proxy/serving/flow_gate.py."""

"""The rescheduler: moves live requests between backends to balance load, to leave failing
backends and to keep decode instances within their TPOT target (docs/rescheduler.md)."""

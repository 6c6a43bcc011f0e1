"""The wire to the engines: the lean HTTP/1.1 client (`upstream`), prefill/decode legs and
NixlConnector's `kv_transfer_params` (`disagg`, `kv_transfer`), the per-backend accounting of
one request (`accounting`), outcome-based ejection (`ejection`), and the KV-cache event
subscribers and their metrics (`kv_event_subscribers`, `kv_event_metrics`).

May import `proxy.stream` and the shared leaves (`settings`, `errors`, `metrics`, `asgi`,
`url_policy`); never the request, control or serving layers.
"""

"""fleet-proxy as the endpoint picker (EPP) of a Gateway API gateway: Envoy forwards, and
asks this process over ext_proc which engine each request goes to (docs/gateway.md)."""

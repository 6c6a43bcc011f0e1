"""fleet-proxy's router process, in layers; each folder's docstring says what it holds.

From the bottom up (a layer imports only the layers below it):
- `stream/`: pure stream transforms (token ledger, splicer, assembled answer, continuation
  rules, move kinds); no I/O, imports nothing else of `proxy`.
- leaves shared by every layer: `settings`, `errors` (with the one `FailureKind`), `metrics`,
  `asgi` (ASGI types and response helpers), `url_policy`.
- `backends/`: the wire to the engines (upstream client, P/D and KV legs, accounting,
  ejection, KV-event subscribers).
- `ports`: the small protocols request and control code reach the proxy's services through.
- `request/`: one client request's life (ASGI entry, body parsing, the session, legs, moves).
- `control/`: the control plane (admin routes and operations, discovery, request log, peer
  sync, the colocated planner).
- `serving/`: the composition root (`wiring.ProxyCore`), app factory, front door, access
  control, admission, workers, serve/demo/CLI. Only this layer imports the composition root.
"""

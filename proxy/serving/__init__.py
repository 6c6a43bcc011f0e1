"""The process and its HTTP edge: the composition root that builds one proxy (`wiring`), the
app factory (`app`), the client-facing server (`front_door`) with its limits per connection
(`front_door_protocol`, `refusal_stats`), access control and admission, worker processes,
and `fleet-proxy` itself (`serve`, `demo`, `cli`).

May import every other layer; nothing outside this folder imports it (the ports in
`proxy.ports` are how other layers reach what it builds).
"""

"""The control plane: the fleet operations (`operations`: add, remove, drain, move, evacuate),
the admin API over them (`admin_routes` builds its router from `admin_access`,
`admin_backends`, `admin_requests` and `admin_state`), the discovery loop, the structured
request log, peer sync between worker processes, and the planner colocated in the proxy
(`colocated_planner`).

May import `proxy.request`, `proxy.stream`, `proxy.backends`, the shared leaves and
`proxy.ports`; never the serving layer (it reaches the proxy's services through the ports).
"""

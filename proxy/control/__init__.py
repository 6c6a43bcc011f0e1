"""The control plane: admin routes (`admin_routes`), the discovery loop, the structured
request log, peer sync between worker processes, and the planner colocated in the proxy
(`colocated_planner`).

May import `proxy.request`, `proxy.stream`, `proxy.backends`, the shared leaves and
`proxy.ports`; never the serving layer (it reaches the proxy's services through the ports).
"""

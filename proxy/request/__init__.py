"""One client request's life: the raw ASGI entry of the OpenAI endpoints (`entry`), the body
parsed once (`body`), the request session that owns the request across its backend legs
(`session`), opening a leg (`legs`) and moving a live stream to another backend (`mover`).

May import `proxy.stream`, `proxy.backends`, the shared leaves and `proxy.ports` (the
proxy's services as protocols); never the control or serving layers.
"""

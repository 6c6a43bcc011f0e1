"""Pure, I/O-free stream transforms: whole SSE events and the token ids a client received
(`token_ledger`), a moved stream spliced into the client's one stream (`splice`), a
non-streamed answer built from stream events (`assembled_answer`), whether and how a request
continues on another server (`continuation`), how a move carries its KV (`move_kinds`), and
the SSE bytes they look for (`sse`).

Imports nothing else of `proxy`: every module here is tested with bytes in, bytes out.
"""

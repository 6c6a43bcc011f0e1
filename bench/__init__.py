"""`fleet-proxy bench`: replay a workload against any OpenAI-compatible base URL and measure it.

Layout: workloads (mooncake, sharegpt, synthetic) build `Session`s; `runner` replays them
through `client` (aiohttp, streaming); `metrics` and `summary` are pure arithmetic over
`RequestRecord`s; `paired` holds the confidence-interval code; `artifacts` and `plots` write
the bundle. Definitions follow `vllm bench serve` (REFERENCE.md section 6).
"""

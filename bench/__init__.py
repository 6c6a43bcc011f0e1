"""`fleet-proxy bench`: replay a workload against any OpenAI-compatible base URL and measure it.

Layout: workloads (mooncake, sharegpt, synthetic) build `Session`s; `runner` replays them
through `client` (aiohttp, streaming); `metrics` and `summary` are pure arithmetic over
`RequestRecord`s; `paired` holds the confidence-interval code; `artifacts` and `plots` write
the bundle. TTFT, TPOT, ITL and E2E are defined as `vllm bench serve` defines them.
"""

"""The OpenAI Responses API served by the proxy, its stored responses kept by the proxy
(docs/api.md "Responses API")."""

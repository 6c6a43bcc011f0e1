# Sourced by the recipes: sets $path and $body for one streamed request from
# MODEL, PROMPT, MAX_TOKENS and API (chat | completions). PROMPT must not contain quotes.
if [ "${API:-chat}" = completions ]; then
  path=/v1/completions
  body=$(printf '{"model":"%s","prompt":"%s","max_tokens":%d,"stream":true}' \
    "$MODEL" "$PROMPT" "$MAX_TOKENS")
else
  path=/v1/chat/completions
  body=$(printf '{"model":"%s","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true}' \
    "$MODEL" "$PROMPT" "$MAX_TOKENS")
fi

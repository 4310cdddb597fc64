#!/usr/bin/env bash
# `make gateway-demo`: metering on embedded SQLite, the LiteLLM proxy in front of it (its models
# answered by LiteLLM's mock responses: nothing leaves the machine), an account with $1 of
# credit, and one chat completion through the proxy with the account's key, charged from the
# usage the customer received. KEEP=1 leaves both running (stop them with the printed command).
set -euo pipefail
cd "$(dirname "$0")/.."

METERING_PORT="${METERING_PORT:-18000}"
PROXY_PORT="${PROXY_PORT:-14000}"
DEMO_DIR="${DEMO_DIR:-data/gateway-demo}"
mkdir -p "$DEMO_DIR"
METERING="http://127.0.0.1:$METERING_PORT"
PROXY="http://127.0.0.1:$PROXY_PORT"
PIDS=()
stop() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; }
[ "${KEEP:-}" = 1 ] || trap stop EXIT

wait_for() {  # URL, seconds
    for _ in $(seq 1 "$2"); do
        curl -sf -o /dev/null "$1" && return 0
        sleep 1
    done
    echo "no answer from $1 after $2 s" >&2
    return 1
}
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

echo "== metering on embedded SQLite at $METERING (data in $DEMO_DIR)"
METERING_DATA_DIR="$DEMO_DIR" METERING_DEMO=false \
    .venv/bin/metering serve --host 127.0.0.1 --port "$METERING_PORT" > "$DEMO_DIR/metering.log" 2>&1 &
PIDS+=($!)
wait_for "$METERING/readyz" 60
. "$DEMO_DIR/dev-tokens.env"

echo "== an account with \$1 of credit, and its API key"
ADMIN=(-H "Authorization: Bearer $METERING_ADMIN_TOKEN" -H 'Content-Type: application/json')
ACCOUNT=$(curl -sf "$METERING/admin/v1/accounts" "${ADMIN[@]}" \
    -d '{"name": "Gateway demo", "billing": "prepaid"}' | json '["id"]')
KEY=$(curl -sf "$METERING/admin/v1/accounts/$ACCOUNT/api-keys" "${ADMIN[@]}" \
    -d '{"name": "demo"}' | json '["key"]')
curl -sf -o /dev/null "$METERING/admin/v1/accounts/$ACCOUNT/grants" "${ADMIN[@]}" \
    -d '{"amount_cents": 100, "idempotency_key": "demo-credit", "note": "demo"}'

echo "== the LiteLLM proxy at $PROXY (clients/python/examples/litellm-config.yaml)"
# LiteLLM's offline switches: its bundled cost map, beta headers and tokenizers, no hub.
METERING_URL="$METERING" METERING_GATEWAY_TOKEN="$METERING_GATEWAY_TOKEN" \
METERING_SPOOL_PATH="$DEMO_DIR/gateway-spool.sqlite3" \
LITELLM_MASTER_KEY="sk-demo-$(python3 -c 'import secrets; print(secrets.token_hex(16))')" \
LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS=True \
LITELLM_LOCAL_BLOG_POSTS=True LITELLM_LOCAL_POLICY_TEMPLATES=True \
LITELLM_LOCAL_AUTOROUTER_PRESETS=True HF_HUB_OFFLINE=1 \
    .venv-gateway/bin/litellm --config clients/python/examples/litellm-config.yaml \
    --host 127.0.0.1 --port "$PROXY_PORT" > "$DEMO_DIR/litellm.log" 2>&1 &
PIDS+=($!)
wait_for "$PROXY/health/liveliness" 120

echo "== credits before:"
curl -sf "$METERING/v1/credits" -H "Authorization: Bearer $KEY"; echo
echo "== a chat completion through the proxy, with the customer's key:"
curl -sf "$PROXY/v1/chat/completions" -H "Authorization: Bearer $KEY" \
    -H 'Content-Type: application/json' \
    -d '{"model": "GLM-5.3", "max_tokens": 256, "messages": [{"role": "user", "content": "Hello!"}]}'
echo
sleep 1  # the client sends usage in the background, batched over 100 ms
echo "== credits after (the usage above at GLM-5.3's rates):"
curl -sf "$METERING/v1/credits" -H "Authorization: Bearer $KEY"; echo
echo "== out of credit: a request whose maximum cost is above the balance is refused by the proxy:"
curl -s "$PROXY/v1/chat/completions" -H "Authorization: Bearer $KEY" \
    -H 'Content-Type: application/json' \
    -d '{"model": "GLM-5.3", "n": 8, "messages": [{"role": "user", "content": "Hello!"}]}'
echo
if [ "${KEEP:-}" = 1 ]; then
    echo "== still running: metering $METERING, proxy $PROXY (key: $KEY); stop: kill ${PIDS[*]}"
fi

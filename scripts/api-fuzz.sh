#!/usr/bin/env bash
# schemathesis (an API fuzzer nobody on this project wrote) against the OpenAPI document that
# `exk8s-api dev` serves, authenticated with the dev operator token. Fails on any 5xx, any
# response whose status, content type, headers or body the document does not describe.
#
#   scripts/api-fuzz.sh [EXAMPLES_PER_OPERATION] [SEED]
#
# scripts/test.sh runs a bounded, seeded pass; scripts/fuzz.sh a longer one with a random seed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

examples=${1:-25}
seed=${2:-$RANDOM$RANDOM}
ensure_packages curl:curl
ensure_venv_tool schemathesis==4.32.5 st

# scripts/test.sh names the binary it has already built (with the features its tests resolve);
# run alone, the script builds one.
api_bin=${EXK8S_API_BIN:-}
if [ -z "$api_bin" ]; then
  cargo build --quiet --locked -p exk8s-api --bin exk8s-api
  api_bin=target/debug/exk8s-api
fi
[ -x "$api_bin" ] || { echo "EXK8S_API_BIN=$api_bin is not an executable" >&2; exit 1; }
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Its own simulator address range, so a concurrent dev stack or test never collides.
"$api_bin" dev --listen "127.0.0.1:$port" --data-dir "$work/dev" \
  --sim-cidr 127.0.13.0/24 >"$work/api.log" 2>&1 &
api=$!
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  kill "$api" 2>/dev/null || true
  wait "$api" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

tries=0
until [ -s "$work/dev/operator.token" ] && curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -gt 300 ] || ! kill -0 "$api" 2>/dev/null; then
    echo "exk8s-api dev did not come up; its log:" >&2
    cat "$work/api.log" >&2
    exit 1
  fi
  sleep 0.1
done

# One worker: with two, CPython 3.11's ast module, used by schemathesis's coverage phase from
# several threads at once, intermittently fails with "SystemError: AST constructor recursion
# depth mismatch" (a CPython bug, not a finding about the API).
# GET /clusters/{id}/events is a Server-Sent Event stream that stays open while the cluster
# exists: a fuzzer reading it to the end would only time out. api/tests/it/events.rs covers it
# (every event type, resumption, refusals) on both databases.
log "schemathesis: $examples examples per operation, seed $seed (the event stream excluded)"
status=0
.venv/bin/st run "http://127.0.0.1:$port/openapi.json" \
  --exclude-path-regex '/events$' \
  --header "Authorization: Bearer $(cat "$work/dev/operator.token")" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-examples "$examples" --seed "$seed" --workers 1 \
  --generation-database none --request-timeout 30 --no-color \
  --output-sanitize true || status=$?
if [ "$status" -ne 0 ]; then
  echo "schemathesis failed (seed $seed); the API's log follows" >&2
  tail -n 200 "$work/api.log" >&2
fi
exit "$status"

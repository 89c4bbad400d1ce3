#!/usr/bin/env bash
# BASELINE ONLY — the seed system's bash shim's file-writing loop, reproduced for comparison
# (seed 003, bootstrap-userdata.sh). Reads a JSON object {"files": {"<path>": "<content>"}}
# like the seed's bundle and writes every file under ROOT, one jq process per field, exactly as
# the shim did. No signature, no modes, no atomic writes: do not use it for anything else.
#
#   bench/seed-shim-apply.sh BUNDLE.json ROOT
set -euo pipefail
TMP_JSON=$1
ROOT=$2

jq -r '.files | to_entries[] | @base64' "$TMP_JSON" | while IFS= read -r entry; do
  key="$(printf '%s' "$entry" | base64 --decode | jq -r '.key')"
  value="$(printf '%s' "$entry" | base64 --decode | jq -r '.value')"
  mkdir -p "$(dirname "$ROOT$key")"
  printf '%s' "$value" > "$ROOT$key"
done

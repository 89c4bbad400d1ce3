#!/usr/bin/env bash
# Runs every benchmark behind BENCHMARKS.md. Not part of the test run: it takes minutes.
# Run it on an otherwise idle machine; the numbers are compared across runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

log "PKI: founding and per-bundle minting, ecdsa-p256 vs rsa-2048"
cargo bench -p exk8s-api --bench pki -- --noplot

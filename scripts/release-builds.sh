#!/usr/bin/env bash
# The release builds the packaging checks need (scripts/test-packaging.sh, scripts/package.sh):
# cargo-deb, the static musl agent, exk8s-api, exk8s and exk8s-capi (in the profile
# package_profile names: with dev, they are the test build's). scripts/test.sh starts this beside
# the test suite under SCHED_IDLE, so it takes only the cores the tests leave idle; the
# packaging scripts then find everything built (their own cargo builds are no-ops).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

ensure_cargo_deb
bash scripts/build-static-agent.sh
package_profile
if [ "$package_profile" = release ]; then
  log "building exk8s-api, exk8s and exk8s-capi (release)"
  cargo build --locked --release -p exk8s-api -p exk8s-cli -p exk8s-capi
fi

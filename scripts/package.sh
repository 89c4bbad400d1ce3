#!/usr/bin/env bash
# Builds the Debian packages into target/debian/: exk8s-api (release build), exk8s-agent
# (the static musl binary), exk8s-cli (the operator CLI, with its shell completions) and
# exk8s-capi (the Cluster API provider).
# EXK8S_PACKAGE_PROFILE=dev packages the dev profile's binaries instead (scripts/test.sh's
# checks; see package_profile in scripts/lib/ensure.sh).
# Installs cargo-deb and dpkg-dev when missing.
#
#   scripts/package.sh            # -> target/debian/exk8s-api_<version>-1_amd64.deb, exk8s-agent_…
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

ensure_cargo_deb
package_profile

if [ "$package_profile" = release ]; then
  log "building exk8s-api, exk8s and exk8s-capi (release)"
  cargo build --locked --release -p exk8s-api -p exk8s-cli -p exk8s-capi
else
  # The binaries the workspace's test build made (scripts/test.sh): packaged as they are.
  for binary in exk8s-api exk8s exk8s-capi; do
    [ -x "target/debug/$binary" ] ||
      { echo "target/debug/$binary is not built (cargo build --workspace)" >&2; exit 1; }
  done
fi
mkdir -p target/completions
"target/$package_dir/exk8s" completions bash >target/completions/exk8s.bash
"target/$package_dir/exk8s" completions zsh >target/completions/_exk8s
"target/$package_dir/exk8s" completions fish >target/completions/exk8s.fish
bash scripts/build-static-agent.sh

out=target/debian
mkdir -p "$out"
rm -f "$out"/exk8s-api_*.deb "$out"/exk8s-agent_*.deb "$out"/exk8s-cli_*.deb "$out"/exk8s-capi_*.deb
log "packaging exk8s-api"
cargo deb --locked --no-build --profile "$package_profile" -p exk8s-api --output "$out"
log "packaging exk8s-cli"
cargo deb --locked --no-build --profile "$package_profile" -p exk8s-cli --output "$out"
log "packaging exk8s-capi"
cargo deb --locked --no-build --profile "$package_profile" -p exk8s-capi --output "$out"
log "packaging exk8s-agent (static, x86_64-unknown-linux-musl)"
cargo deb --locked --no-build --profile "$package_profile" -p exk8s-agent --target x86_64-unknown-linux-musl \
  --output "$out"
ls -l "$out"/*.deb

#!/usr/bin/env bash
# Builds exk8s-agent as a static musl executable and prints where it is and how large.
# Installs the musl target and musl-tools when missing.
#
#   scripts/build-static-agent.sh            # -> target/x86_64-unknown-linux-musl/release/exk8s-agent
#   EXK8S_PACKAGE_PROFILE=dev scripts/build-static-agent.sh   # -> …/debug/exk8s-agent
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

target=x86_64-unknown-linux-musl
if ! rustup target list --installed | grep -qx "$target"; then
  log "installing the rust target $target"
  rustup target add "$target"
fi
ensure_packages musl-gcc:musl-tools file:file

package_profile
log "building exk8s-agent ($package_profile, $target)"
CC_x86_64_unknown_linux_musl=musl-gcc \
  cargo build --locked --profile "$package_profile" --target "$target" -p exk8s-agent

binary="target/$target/$package_dir/exk8s-agent"
description=$(file -b "$binary")
case "$description" in
  *"statically linked"* | *"static-pie linked"*) ;;
  *) echo "not a static executable: $description" >&2; exit 1 ;;
esac
linkage=$(ldd "$binary" 2>&1 || true)
case "$linkage" in
  *"statically linked"* | *"not a dynamic executable"*) ;;
  *) echo "ldd reports dynamic dependencies for $binary: $linkage" >&2; exit 1 ;;
esac
size=$(stat -c %s "$binary")
echo "$binary: static, $size bytes ($((size / 1024)) KiB)"

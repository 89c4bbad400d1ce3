#!/usr/bin/env bash
# scripts/s3-server.sh
#
# Builds, once per machine, the S3-compatible server the snapshot tests store into: s3s-fs from
# crates.io (a real S3 HTTP service over a directory, SigV4 authentication, multipart uploads),
# run by the tests as a process of its own. A test tool: nothing built here ships.
#
# Output: $EXK8S_K8S_CACHE/s3s-fs-<version>/bin/s3s-fs (default cache /var/cache/exk8s/k8s),
# printed on stdout; everything else goes to stderr. Idempotent, and safe when several callers
# ask at once (flock).
set -euo pipefail

# 0.14.1 is the newest release that builds with this repository's Rust (0.17 needs 1.96).
version=0.14.1
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}
root="$cache/s3s-fs-$version"
binary="$root/bin/s3s-fs"

log() { printf '==> s3-server: %s\n' "$*" >&2; }

mkdir -p "$cache"
exec 9>"$root.lock"
flock 9
if [ ! -x "$binary" ]; then
  log "building s3s-fs $version from crates.io (once per machine)"
  # A debug build: the tests store a few small snapshots, and a fresh machine builds it in a
  # fraction of the release build's time (without debug information: a sixth less).
  CARGO_PROFILE_DEV_DEBUG=false cargo install s3s-fs --version "$version" --features binary --locked --debug --root "$root" \
    --quiet >&2
fi
"$binary" --version >&2
echo "$binary"

#!/usr/bin/env bash
# scripts/e2e-binaries.sh K8S_VERSION
#
# Builds, once per machine and release, what judges a booted cluster: Kubernetes' end-to-end
# suite `e2e.test` (k8s.io/kubernetes/test/e2e, whose `[Conformance]` specs are the conformance
# tests) and its test image's binary `agnhost` (test/images/agnhost, served by the node registry
# as registry.k8s.io/e2e-test-images/agnhost:<its VERSION>). Built in a copy of the scratch module
# scripts/k8s-binaries.sh generated for the release (run it first). Go is a test tool: nothing
# built here ships.
#
# Output, on stdout: agnhost, its image tag and e2e.test, one per line; everything else goes to
# stderr. Idempotent (a finished build leaves a stamp) and safe when several callers ask at once
# (flock).
set -euo pipefail

k8s_version=${1:?usage: e2e-binaries.sh K8S_VERSION}
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}

log() { printf '==> e2e-binaries: %s\n' "$*" >&2; }
die() { printf 'e2e-binaries: %s\n' "$*" >&2; exit 1; }

[[ $k8s_version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "Kubernetes version must look like v1.35.3, got '$k8s_version'"
command -v go >/dev/null || die "go is not installed (the suite builds from its Go module)"
release_src=$cache/$k8s_version/src
[ -f "$release_src/go.mod" ] || die "no $release_src/go.mod: run scripts/k8s-binaries.sh $k8s_version first"

# shellcheck source=scripts/lib/cache.sh
source "$(dirname "$0")/lib/cache.sh"

build_e2e() {
  local dir=$1
  mkdir -p "$dir/src" "$dir/bin"
  cp "$release_src/go.mod" "$release_src/go.sum" "$dir/src/"
  log "building agnhost and e2e.test from Kubernetes $k8s_version"
  (
    cd "$dir/src"
    export CGO_ENABLED=0 GOFLAGS="-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local
    go build -trimpath -ldflags "-s -w" -o "$dir/bin/agnhost" k8s.io/kubernetes/test/images/agnhost
    go test -c -trimpath -ldflags "-s -w" -o "$dir/bin/e2e.test" k8s.io/kubernetes/test/e2e
    tr -d '[:space:]' <"$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/VERSION" \
      >"$dir/agnhost-version"
  )
  "$dir/bin/agnhost" --help >/dev/null || die "agnhost does not run"
  "$dir/bin/e2e.test" --list-images >/dev/null || die "e2e.test does not run"
}
with_lock "$cache/$k8s_version-e2e" build_e2e

echo "$cache/$k8s_version-e2e/bin/agnhost"
cat "$cache/$k8s_version-e2e/agnhost-version"
echo
echo "$cache/$k8s_version-e2e/bin/e2e.test"

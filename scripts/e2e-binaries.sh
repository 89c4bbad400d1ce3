#!/usr/bin/env bash
# scripts/e2e-binaries.sh K8S_VERSION [--agnhost]
#
# Builds, once per machine and release, what judges a booted cluster: the binary `agnhost` of
# Kubernetes' test image (test/images/agnhost, served by the node registry as
# registry.k8s.io/e2e-test-images/agnhost:<its VERSION>) and the end-to-end suite `e2e.test`
# (k8s.io/kubernetes/test/e2e, whose `[Conformance]` specs are the conformance tests), each into
# its own cache directory — the registry needs agnhost before the booted clusters start, the
# suite is run only later (scripts/test.sh builds it beside them). Built in a copy of the scratch
# module scripts/k8s-binaries.sh generated for the release (run it first). Go is a test tool:
# nothing built here ships.
#
# Output, on stdout: agnhost, its image tag and (without --agnhost) e2e.test, one per line;
# everything else goes to stderr. Idempotent (a finished build leaves a stamp) and safe when
# several callers ask at once (flock).
set -euo pipefail

k8s_version=${1:?usage: e2e-binaries.sh K8S_VERSION [--agnhost]}
only_agnhost=false
case "${2:-}" in
  "") ;;
  --agnhost) only_agnhost=true ;;
  *) printf 'e2e-binaries: unknown option %s (usage: e2e-binaries.sh K8S_VERSION [--agnhost])\n' "$2" >&2; exit 2 ;;
esac
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}

log() { printf '==> e2e-binaries: %s\n' "$*" >&2; }
die() { printf 'e2e-binaries: %s\n' "$*" >&2; exit 1; }

[[ $k8s_version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "Kubernetes version must look like v1.35.3, got '$k8s_version'"
command -v go >/dev/null || die "go is not installed (the suite builds from its Go module)"
release_src=$cache/$k8s_version/src
[ -f "$release_src/go.mod" ] || die "no $release_src/go.mod: run scripts/k8s-binaries.sh $k8s_version first"

# shellcheck source=scripts/lib/cache.sh
source "$(dirname "$0")/lib/cache.sh"

# go BUILD-ARGS...: go in a copy of the release's scratch module ($dir/src).
release_go() {
  local dir=$1
  shift
  mkdir -p "$dir/src" "$dir/bin"
  cp "$release_src/go.mod" "$release_src/go.sum" "$dir/src/"
  (
    cd "$dir/src"
    export CGO_ENABLED=0 GOFLAGS="-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local
    go "$@"
  )
}

build_agnhost() {
  local dir=$1
  log "building agnhost from Kubernetes $k8s_version"
  release_go "$dir" build -trimpath -ldflags "-s -w" -o "$dir/bin/agnhost" k8s.io/kubernetes/test/images/agnhost
  local module
  module=$(cd "$dir/src" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  tr -d '[:space:]' <"$module/test/images/agnhost/VERSION" >"$dir/agnhost-version"
  "$dir/bin/agnhost" --help >/dev/null || die "agnhost does not run"
}

build_e2e() {
  local dir=$1
  log "building e2e.test from Kubernetes $k8s_version"
  release_go "$dir" test -c -trimpath -ldflags "-s -w" -o "$dir/bin/e2e.test" k8s.io/kubernetes/test/e2e
  "$dir/bin/e2e.test" --list-images >/dev/null || die "e2e.test does not run"
}

with_lock "$cache/$k8s_version-agnhost" build_agnhost
echo "$cache/$k8s_version-agnhost/bin/agnhost"
cat "$cache/$k8s_version-agnhost/agnhost-version"
echo
if ! $only_agnhost; then
  with_lock "$cache/$k8s_version-e2e" build_e2e
  echo "$cache/$k8s_version-e2e/bin/e2e.test"
fi

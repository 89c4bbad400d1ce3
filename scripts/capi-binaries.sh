#!/usr/bin/env bash
# scripts/capi-binaries.sh [VERSION]
#
# Builds, once per machine, the real Cluster API the provider test runs (tests/tests/capi/):
# its core controller (`core/main.go`: the Cluster, Machine and MachinePool controllers) and
# clusterctl from the Go module sigs.k8s.io/cluster-api, and copies its core CRDs
# (`core/config/crd/bases`). Its go.mod replaces sigs.k8s.io/cluster-api/api with ./api, which
# `go install` refuses: a scratch module requires the release and replaces that module with its
# published version, as scripts/k8s-binaries.sh does for Kubernetes. Go is a test tool: nothing
# built here ships.
#
# Output: $EXK8S_K8S_CACHE/cluster-api-<version>/bin (core, clusterctl) and .../crds, one per
# line on stdout (default cache /var/cache/exk8s/k8s); everything else goes to stderr.
# Idempotent, and safe when several callers ask at once (flock).
set -euo pipefail

# shellcheck source=scripts/lib/versions.sh
source "$(dirname "$0")/lib/versions.sh"
version=${1:-$cluster_api_version}
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}

log() { printf '==> capi-binaries: %s\n' "$*" >&2; }
die() { printf 'capi-binaries: %s\n' "$*" >&2; exit 1; }

[[ $version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "the Cluster API version must look like v1.14.2, got '$version'"
command -v go >/dev/null || die "go is not installed (the tests build Cluster API from its Go module)"
mkdir -p "$cache" 2>/dev/null || die "cannot create the cache $cache (set EXK8S_K8S_CACHE to a writable directory)"

# shellcheck source=scripts/lib/cache.sh
source "$(dirname "$0")/lib/cache.sh"
export "${go_env[@]}"

build_cluster_api() {
  local dir=$1 src=$1/src
  mkdir -p "$src" "$dir/bin" "$dir/crds"
  log "building Cluster API $version (core controller, clusterctl)"
  (
    cd "$src"
    go mod init exk8s.test/cluster-api >/dev/null 2>&1
    go mod edit -require="sigs.k8s.io/cluster-api@$version" \
      -replace="sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@$version"
    local ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$version"
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin/" \
      sigs.k8s.io/cluster-api/core sigs.k8s.io/cluster-api/cmd/clusterctl
    local module
    module=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
    cp "$module"/core/config/crd/bases/*.yaml "$dir/crds/"
    chmod u+w "$dir"/crds/*.yaml
  )
  local out
  out=$("$dir/bin/clusterctl" version -o short 2>&1) || true
  [[ $out == *"$version"* ]] || die "clusterctl version says '$out', not $version"
  [ -f "$dir/crds/cluster.x-k8s.io_clusters.yaml" ] || die "no Cluster CRD in the module's core/config/crd/bases"
}

with_lock "$cache/cluster-api-$version" build_cluster_api
echo "$cache/cluster-api-$version/bin"
echo "$cache/cluster-api-$version/crds"

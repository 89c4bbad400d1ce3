#!/usr/bin/env bash
# scripts/e2e-binaries.sh K8S_VERSION [--agnhost | --selected]
#
# Builds, once per machine and release, what judges a booted cluster: the binary `agnhost` of
# Kubernetes' test image (test/images/agnhost, served by the node registry as
# registry.k8s.io/e2e-test-images/agnhost:<its VERSION>) and the end-to-end suite `e2e.test`
# (k8s.io/kubernetes/test/e2e, whose `[Conformance]` specs are the conformance tests), each into
# its own cache directory — the registry needs agnhost before the booted clusters start, the
# suite is run only later. Built in a copy of the scratch module scripts/k8s-binaries.sh
# generated for the release (run it first). Go is a test tool: nothing built here ships.
#
# --selected builds, instead of the whole suite, the suite's own main package (test/e2e's
# e2e.go, e2e_test.go, providers.go and suites.go, copied as they are) with only the spec
# packages the booted clusters' selection lives in (tests/tests/boot_cluster/conformance.rs;
# SELECTED_SPECS below): the same framework, flags, reports and specs, less the packages no
# selected spec is in (storage, apps, kubectl, dra, ...) — about half the suite's compile, which
# a fresh machine's test run pays before its booted clusters. scripts/conformance.sh runs the
# whole suite.
#
# Output, on stdout: agnhost, its image tag and (without --agnhost) e2e.test, one per line;
# everything else goes to stderr. Idempotent (a finished build leaves a stamp) and safe when
# several callers ask at once (flock).
set -euo pipefail

k8s_version=${1:?usage: e2e-binaries.sh K8S_VERSION [--agnhost | --selected]}
suite=whole
case "${2:-}" in
  "") ;;
  --agnhost) suite=none ;;
  --selected) suite=selected ;;
  *) printf 'e2e-binaries: unknown option %s (usage: e2e-binaries.sh K8S_VERSION [--agnhost | --selected])\n' "$2" >&2; exit 2 ;;
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

# go_in DIR GO-ARGS...: go in DIR, built as every tool here is.
go_in() {
  local dir=$1
  shift
  (cd "$dir" && gomod "$@")
}

# release_go DIR GO-ARGS...: go in a copy of the release's scratch module ($dir/src).
release_go() {
  local dir=$1
  shift
  mkdir -p "$dir/src" "$dir/bin"
  cp "$release_src/go.mod" "$release_src/go.sum" "$dir/src/"
  go_in "$dir/src" "$@"
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
  release_go "$dir" test -c -vet=off -trimpath -ldflags "-s -w" -o "$dir/bin/e2e.test" k8s.io/kubernetes/test/e2e
  "$dir/bin/e2e.test" --list-images >/dev/null || die "e2e.test does not run"
}

# The spec packages (under test/e2e) the booted clusters' selection needs: Services, networking
# and DNS (network), pods, ConfigMaps and Secrets (common: its node and storage specs),
# service-account tokens and SubjectReview (auth), the admission webhook (apimachinery); with
# the suite's own setup: the feature gates' names, the invariants checked after the suite, and
# the framework's reconfiguration.
SELECTED_SPECS="apimachinery auth common network"
KEPT_IMPORTS="feature invariants framework/debug/init framework/metrics/init framework/node/init"

build_e2e_selected() {
  local dir=$1 module main
  log "building e2e.test from Kubernetes $k8s_version with the spec packages $SELECTED_SPECS"
  module=$(release_go "$dir" list -m -f '{{.Dir}}' k8s.io/kubernetes)
  [ -f "$module/test/e2e/e2e_test.go" ] || die "no test/e2e/e2e_test.go in $module"
  main=$dir/src/e2e
  mkdir -p "$main"
  cp "$module/test/e2e/e2e.go" "$module/test/e2e/providers.go" "$module/test/e2e/suites.go" "$main/"
  # e2e_test.go as it is, but for its blank imports of spec packages outside the selection.
  local kept=" $SELECTED_SPECS $KEPT_IMPORTS " line pkg dropped=()
  while IFS= read -r line; do
    if [[ $line =~ ^[[:space:]]_\ \"k8s\.io/kubernetes/test/e2e/([a-z0-9/]+)\"$ ]]; then
      pkg=${BASH_REMATCH[1]}
      if [[ $kept != *" $pkg "* ]]; then
        dropped+=("$pkg")
        continue
      fi
    fi
    printf '%s\n' "$line"
  done <"$module/test/e2e/e2e_test.go" >"$main/e2e_test.go"
  chmod u+w "$main"/*.go
  local want
  for want in $SELECTED_SPECS $KEPT_IMPORTS; do
    grep -qF "_ \"k8s.io/kubernetes/test/e2e/$want\"" "$main/e2e_test.go" ||
      die "e2e_test.go of $k8s_version does not import test/e2e/$want: update SELECTED_SPECS or KEPT_IMPORTS"
  done
  [ "${#dropped[@]}" -gt 0 ] || die "no spec package was left out of e2e_test.go: its imports changed shape"
  log "  left out: ${dropped[*]}"
  # -vet=off: `go test` vets what it builds, and vet's analyzers walk every package the suite
  # imports for their facts (86 CPU-seconds of a fresh machine's run, measured): the suite is
  # upstream's, built to be run, not reviewed.
  go_in "$dir/src" test -c -vet=off -trimpath -ldflags "-s -w" -o "$dir/bin/e2e.test" ./e2e
  "$dir/bin/e2e.test" --list-images >/dev/null || die "e2e.test does not run"
}

with_lock "$cache/$k8s_version-agnhost" build_agnhost
echo "$cache/$k8s_version-agnhost/bin/agnhost"
cat "$cache/$k8s_version-agnhost/agnhost-version"
echo
case $suite in
  whole)
    with_lock "$cache/$k8s_version-e2e" build_e2e
    echo "$cache/$k8s_version-e2e/bin/e2e.test"
    ;;
  selected)
    with_lock "$cache/$k8s_version-e2e-selected" build_e2e_selected
    echo "$cache/$k8s_version-e2e-selected/bin/e2e.test"
    ;;
esac

#!/usr/bin/env bash
# THE test command (named in README.md and run by .ci/run).
#
# Installs, only when missing, whatever the suite needs on a fresh Debian machine, then runs
# formatting, lints and the whole workspace test suite. Nothing is skipped: a missing tool is
# installed or the run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

log "checking tools"
ensure_rust_components
# openssl: the independent verifier of every certificate the PKI makes.
ensure_packages openssl:openssl
# Real components and validators the tests run (never skipped when missing: installed here).
ensure_packages shellcheck:shellcheck systemd-analyze:systemd python3:python3 \
  flock:util-linux chrt:util-linux ip:iproute2
ensure_packages psql:postgresql-client
# kubectl (client-go) reads the kubeconfigs the CLI merges.
ensure_packages kubectl:kubernetes-client
# What the node registry's images are built from (scripts/node-registry.sh): busybox-static, a
# static C toolchain for the sandbox image's pause, and the tools the conformance suite's agnhost
# runs; nsenter to enter a booted machine, iptables to show a booted node's rules when a
# workload check fails; HAProxy, the outside load balancer docs/apiserver-endpoint.md shows,
# and dnsmasq, the DNS server it follows the control plane's name through.
ensure_packages busybox:busybox-static cc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev \
  file:file curl:curl nc.openbsd:netcat-openbsd nsenter:util-linux iptables:iptables \
  haproxy:haproxy dnsmasq:dnsmasq-base
# Machines that boot (tests/src/machine.rs): the node image's root from Debian's packages, booted
# by systemd-nspawn with systemd as PID 1.
ensure_packages debootstrap:debootstrap systemd-nspawn:systemd-container \
  dpkg-scanpackages:dpkg-dev
ensure_postgres
ensure_postgres_server_binaries
drop_test_databases
export EXK8S_TEST_POSTGRES_URL="${EXK8S_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
ensure_venv_tool kubernetes-validate kubernetes-validate
export EXK8S_KUBERNETES_VALIDATE="$PWD/.venv/bin/kubernetes-validate"
# pyca/cryptography: a strict DER parser every certificate kind must pass (api/tests/it/pki.rs).
ensure_venv_module cryptography cryptography
export EXK8S_PYTHON="$PWD/.venv/bin/python"

# The real Kubernetes and etcd the tests run, built from their Go modules once per machine into
# a cache (scripts/k8s-binaries.sh), in the background from here on — beside the lints and the
# Rust build, which leave cores idle while one large crate compiles or links: the versions the
# renderer pins first (most tests need only them: the first part of the tests starts once they
# are built), then the next minor's release the upgrade tests go to, each with its etcd
# (tests/src/bins.rs names them all; scripts/lib/versions.sh holds them), Kubernetes'
# end-to-end suite and the S3 server, while the first part runs. A file marks each stage done.
# What only the second part needs is built at nice 10: on a new machine the Rust build and the
# first release come first, and the first part (at nice 10 too) gets its share beside it.
# shellcheck source=scripts/lib/versions.sh
source scripts/lib/versions.sh
log "Kubernetes $k8s_version and etcd $etcd_version, then $k8s_next and etcd $etcd_next, Kubernetes' end-to-end suite and the S3 server the snapshot tests use (in the background; built once per machine)"
k8s_log=$(mktemp)
{
  bash scripts/k8s-binaries.sh "$k8s_version" "$etcd_version" >"$k8s_log.out" &&
    touch "$k8s_log.first-done" &&
    nice -n 10 bash scripts/k8s-binaries.sh "$k8s_next" "$etcd_next" >"$k8s_log.next" &&
    touch "$k8s_log.next-done" &&
    nice -n 10 bash scripts/e2e-binaries.sh "$k8s_version" >"$k8s_log.e2e" &&
    nice -n 10 bash scripts/s3-server.sh >"$k8s_log.s3"
} 2>"$k8s_log" &
k8s_build=$!

# The node image's root (Debian 12 with systemd), made by debootstrap, the local mirror of the
# Debian packages a node installs on it, and the Go-built tools of its registry, helm and CoreDNS
# (the registry's images follow once both are done): once per machine, at nice 10 (only the
# booted tests need them).
log "the node image's root and its package mirror (in the background, nice 10; built once per machine)"
image_log=$(mktemp)
{
  nice -n 10 bash scripts/node-image.sh >"$image_log.out" &&
    nice -n 10 bash scripts/node-packages.sh "$(cat "$image_log.out")" >"$image_log.packages" &&
    nice -n 10 bash scripts/node-registry.sh --tools
} 2>"$image_log" &
image_build=$!

# cargo-deny and mdBook, built once per machine, under SCHED_IDLE beside everything else: only
# idle cores.
log "cargo-deny and mdbook (in the background, SCHED_IDLE; the dependency graph is checked and the book built after the tests)"
deny_log=$(mktemp)
chrt --idle 0 nice -n 19 bash -c 'source scripts/lib/ensure.sh; ensure_cargo_deny && ensure_mdbook' >"$deny_log" 2>&1 &
deny_install=$!

log "shellcheck (every script in the repository)"
git ls-files '*.sh' .ci/run | xargs shellcheck --severity=style --external-sources

log "cargo fmt --check"
cargo fmt --all --check

# One compile both lints and builds: the workspace's crates go through clippy-driver (what
# `cargo clippy` runs, as the workspace wrapper: rustc plus clippy's lints, which then compiles
# on), with warnings as errors — the same lints as `cargo clippy --all-targets -- -D warnings`,
# and no second, check-only compile of every dependency. `cargo test` below runs under the
# same wrapper, so it finds everything built. Every target is built (benches in the dev
# profile): the end-to-end tests run the binaries; asking for the test targets resolves
# features with the dev-dependencies, as `cargo test` does.
clippy_driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver) ||
  { echo "clippy-driver is not installed (rustup component add clippy)" >&2; exit 1; }
linted=(env "RUSTC_WORKSPACE_WRAPPER=$clippy_driver" CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__)
log "cargo build with clippy's lints (warnings are errors): every target, as cargo test resolves them"
"${linted[@]}" cargo build --workspace --locked --all-targets

# Read with a Rust parser (tools/module-cycles; its made-up crate's traps are its unit tests).
log "no dependency circle between files or modules (tools/module-cycles)"
target/debug/module-cycles api/src agent/src cli/src common/src api-types/src tests/src loadgen/src \
  fuzz/src tools/module-cycles/src tools/cli-reference/src

# The tests run in two parts, side by side. The first starts as soon as the first release is
# built: every test that needs no booted machine (the API's, the agent's, the CLI's and the
# harnessed end-to-end tests), then, once the next release is built, the harnessed upgrade. The
# second starts once everything is built and the registry is filled: the tests that boot
# machines (they wait on their machines most of the time, so the first part's work fits beside
# them). The first part runs at nice 10, as the builds only the second part needs do: once the
# second part runs, its machines come first.
booted_tests=(boot boot_cluster)
next_tests=(control_plane_upgrade)
# The first part's targets: every library, binary and test target the workspace tests (cargo
# metadata's `test` flag), but the two lists above. Always `--workspace`: selecting fewer
# packages could resolve their dependencies' features differently and build them again.
mapfile -t first_targets < <(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
skip = set(sys.argv[1:])
seen = set()
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        kind = target["kind"][0]
        if not target.get("test") or target["name"] in skip:
            continue
        arg = {"lib": "--lib", "bin": "--bin=" + target["name"], "test": "--test=" + target["name"]}.get(kind)
        if arg and arg not in seen:
            seen.add(arg)
            print(arg)
' "${booted_tests[@]}" "${next_tests[@]}")
[ ${#first_targets[@]} -gt 10 ] || { echo "cargo metadata listed too few test targets: ${first_targets[*]}" >&2; exit 1; }

# stage_built MARK WHAT: waits until the background build marked MARK done; fails naming WHAT.
stage_built() {
  while [ ! -e "$k8s_log.$1" ]; do
    if ! kill -0 "$k8s_build" 2>/dev/null && [ ! -e "$k8s_log.$1" ]; then
      cat "$k8s_log" >&2
      echo "building $2 failed (above)" >&2
      return 1
    fi
    sleep 2
  done
}

log "waiting for Kubernetes $k8s_version and etcd $etcd_version"
stage_built first-done "Kubernetes $k8s_version or etcd $etcd_version" || exit 1
EXK8S_ETCD_BIN=$(sed -n 1p "$k8s_log.out")
EXK8S_K8S_BIN=$(sed -n 2p "$k8s_log.out")
export EXK8S_ETCD_BIN EXK8S_K8S_BIN

# The release builds the packaging checks need, beside the tests under SCHED_IDLE: they take only
# the cores the tests leave idle (a real control plane waits on its components much of the
# time), so they never slow a test, and packaging later finds them built.
log "release builds for packaging (in the background, SCHED_IDLE: only idle cores)"
release_log=$(mktemp)
chrt --idle 0 nice -n 19 bash scripts/release-builds.sh >"$release_log" 2>&1 &
release_builds=$!

# The first part's output is kept in a file and printed whole when it ends, the second's shown
# as it runs and kept too (the real control-plane tests print every agent's log); on failure
# every panic is printed again, last.
first_log=$(mktemp)
log "cargo test, first part (in the background, nice 10): ${#first_targets[@]} targets and the doc tests, then ${next_tests[*]} once $k8s_next is built"
{
  failed=0
  started=$(date +%s)
  nice -n 10 "${linted[@]}" cargo test --workspace --locked --no-fail-fast "${first_targets[@]}" || failed=1
  nice -n 10 "${linted[@]}" cargo test --workspace --locked --no-fail-fast --doc || failed=1
  if stage_built next-done "Kubernetes $k8s_next or etcd $etcd_next"; then
    EXK8S_ETCD_NEXT_BIN=$(sed -n 1p "$k8s_log.next")
    EXK8S_K8S_NEXT_BIN=$(sed -n 2p "$k8s_log.next")
    export EXK8S_ETCD_NEXT_BIN EXK8S_K8S_NEXT_BIN
    next_args=()
    for name in "${next_tests[@]}"; do next_args+=(--test "$name"); done
    nice -n 10 "${linted[@]}" cargo test --workspace --locked --no-fail-fast "${next_args[@]}" || failed=1
  else
    failed=1
  fi
  echo "the first part took $(($(date +%s) - started)) s"
  exit "$failed"
} >"$first_log" 2>&1 &
first_part=$!

# fail MESSAGE: ends the run once the first part has ended too (nothing is left running),
# printing its results.
fail() {
  echo "$1" >&2
  log "waiting for the first part of the tests to end"
  wait "$first_part" || true
  log "cargo test, first part:"
  cat "$first_log"
  exit 1
}

if ! wait "$k8s_build"; then
  cat "$k8s_log" >&2
  fail "building Kubernetes, etcd, the end-to-end suite or the S3 server failed (above)"
fi
grep -E '^==> (k8s-binaries|e2e-binaries|s3-server)' "$k8s_log" >&2 || true
EXK8S_ETCD_NEXT_BIN=$(sed -n 1p "$k8s_log.next")
EXK8S_K8S_NEXT_BIN=$(sed -n 2p "$k8s_log.next")
EXK8S_S3_SERVER=$(cat "$k8s_log.s3")
EXK8S_E2E_TEST=$(sed -n 3p "$k8s_log.e2e")
export EXK8S_ETCD_NEXT_BIN EXK8S_K8S_NEXT_BIN EXK8S_S3_SERVER EXK8S_E2E_TEST
if ! wait "$image_build"; then
  cat "$image_log" >&2
  fail "building the node image failed (above)"
fi
grep -E '^==> node-(image|packages|registry)' "$image_log" >&2 || true
EXK8S_NODE_IMAGE=$(cat "$image_log.out")
EXK8S_NODE_PACKAGES=$(cat "$image_log.packages")
export EXK8S_NODE_IMAGE EXK8S_NODE_PACKAGES

# The registry booted machines pull from: the control plane's images from the Kubernetes
# binaries of both releases (an upgrade pulls the next), kube-proxy's with the node packages'
# iptables, CoreDNS's (filled once per machine).
log "the node registry's images"
registry_log=$(mktemp)
if ! registry_out=$(bash scripts/node-registry.sh "$EXK8S_K8S_BIN" "$EXK8S_K8S_NEXT_BIN" 2>"$registry_log"); then
  cat "$registry_log" >&2
  fail "filling the node registry failed (above)"
fi
grep -E '^==> node-registry' "$registry_log" >&2 || true
EXK8S_NODE_REGISTRY=$(sed -n 1p <<<"$registry_out")
EXK8S_NODE_REGISTRY_STORE=$(sed -n 2p <<<"$registry_out")
EXK8S_NODE_HELM=$(sed -n 3p <<<"$registry_out")
export EXK8S_NODE_REGISTRY EXK8S_NODE_REGISTRY_STORE EXK8S_NODE_HELM

log "cargo test, second part: the tests that boot machines (${booted_tests[*]}), beside the first part"
booted_log=$(mktemp)
booted_args=()
for name in "${booted_tests[@]}"; do booted_args+=(--test "$name"); done
booted_failed=0
started=$(date +%s)
"${linted[@]}" cargo test --workspace --locked --no-fail-fast "${booted_args[@]}" 2>&1 | tee "$booted_log" ||
  booted_failed=1
log "the second part took $(($(date +%s) - started)) s; waiting for the first"
first_failed=0
wait "$first_part" || first_failed=1
log "cargo test, first part:"
cat "$first_log"
if [ "$first_failed$booted_failed" != 00 ]; then
  log "cargo test failed; the panics, again:"
  grep -h -E -A 14 '^thread .* panicked at ' "$first_log" "$booted_log" | cut -c1-2000 >&2 || true
  grep -h -E '^---- |^error: .* target' "$first_log" "$booted_log" >&2 || true
  exit 1
fi

log "schemathesis against the served OpenAPI document (bounded, fixed seed)"
EXK8S_API_BIN=target/debug/exk8s-api bash scripts/api-fuzz.sh "${EXK8S_SCHEMATHESIS_EXAMPLES:-50}" "${EXK8S_SCHEMATHESIS_SEED:-20261122}"

log "cargo deny: bans, licenses and sources (deny.toml); exk8s-common's own bans (common/deny.toml)"
if ! wait "$deny_install"; then
  cat "$deny_log" >&2
  echo "installing cargo-deny or mdbook failed (above)" >&2
  exit 1
fi
cargo deny --locked check bans licenses sources
# The static agent links exk8s-common: no async runtime, HTTP stack or database in it.
cargo deny --locked --manifest-path common/Cargo.toml --exclude-dev check bans

# The documentation as a book (its pages' links are checked by tests/tests/docs.rs).
log "mdbook build (the documentation as a book, into target/book)"
mdbook build

log "waiting for the release builds"
if ! wait "$release_builds"; then
  cat "$release_log" >&2
  echo "the release builds for packaging failed (above)" >&2
  exit 1
fi
grep -E '^==> ' "$release_log" >&2 || true

log "packaging: static agent, image bake, unit verification"
bash scripts/test-packaging.sh

log "Debian packages: lintian, install, files and units, remove and purge"
bash scripts/test-deb.sh

log "all checks passed"

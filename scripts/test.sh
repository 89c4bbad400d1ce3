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
# The real Kubernetes and etcd the tests run, built from their Go modules once per machine into
# a cache (scripts/k8s-binaries.sh), in the background from here on, before anything else (they
# need only Go; the installs below mostly wait on the network) — beside the lints and the Rust
# build, which leave cores idle while one large crate compiles or links: the versions the
# renderer pins, and the next minor's release the upgrade tests go to, each with its etcd
# (tests/src/bins.rs names them all; scripts/lib/versions.sh holds them).
# shellcheck source=scripts/lib/versions.sh
source scripts/lib/versions.sh
# Go's build and module caches for these builds, apart from the user's own: about 15 GiB once
# everything is built, and needed only while building (each tool lands in /var/cache/exk8s), so
# they are freed below, in the background beside the tests, whose booted machines need the room.
export GOCACHE=/var/cache/exk8s/go/build GOMODCACHE=/var/cache/exk8s/go/mod
log "disk: $(df -h --output=avail / | tail -n 1 | tr -d ' ') free on /"
log "Kubernetes $k8s_version (with the end-to-end suite's packages the booted clusters' selection needs) and $k8s_next, etcd $etcd_version and $etcd_next from their Go modules, then the S3 server the snapshot tests use (in the background; built once per machine)"
k8s_log=$(mktemp)
{
  bash scripts/k8s-binaries.sh "$k8s_version" "$etcd_version" >"$k8s_log.out" &&
    bash scripts/e2e-binaries.sh "$k8s_version" --selected >"$k8s_log.e2e" &&
    bash scripts/k8s-binaries.sh "$k8s_next" "$etcd_next" >"$k8s_log.next" &&
    ensure_packages ld.mold:mold && bash scripts/s3-server.sh >"$k8s_log.s3"
} 2>"$k8s_log" &
k8s_build=$!

# One compile both lints and builds, in the background from here, beside the Go builds (before
# the installs below, which need neither it nor they them; a C compiler it needs for its
# linker and C dependencies): the workspace's crates go through clippy-driver (what
# `cargo clippy` runs, as the workspace wrapper: rustc plus clippy's lints, which then compiles
# on), with warnings as errors — the same lints as `cargo clippy --all-targets -- -D warnings`,
# and no second, check-only compile of every dependency. `cargo test` below runs under the
# same wrapper, so it finds everything built. First what the booted clusters run — the
# binaries and their test — so that they start as soon as their Kubernetes, node image and
# registry are ready; every other target (benches in the dev profile) is built beside them
# (below). Asked of the whole workspace with a test target, as `cargo test` asks: one package
# alone, or no test target, resolves the dependencies' features apart and would build them
# again.
# mold: the linker .ci/run asks for (faster than GNU ld on the large test binaries; the S3
# server's cargo install above makes sure of it too, on a machine whose Go builds are cached).
ensure_packages cc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev ld.mold:mold
clippy_driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver) ||
  { echo "clippy-driver is not installed (rustup component add clippy)" >&2; exit 1; }
linted=(env "RUSTC_WORKSPACE_WRAPPER=$clippy_driver" CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__)
log "cargo build with clippy's lints (warnings are errors): the binaries and the booted clusters' test (in the background; every other target follows beside the booted clusters)"
rust_log=$(mktemp)
"${linted[@]}" cargo build --workspace --locked --bins --test boot_cluster \
  --message-format=json-render-diagnostics >"$rust_log.json" 2>"$rust_log" &
rust_build=$!

# openssl: the independent verifier of every certificate the PKI makes.
ensure_packages openssl:openssl
# Real components and validators the tests run (never skipped when missing: installed here).
ensure_packages shellcheck:shellcheck systemd-analyze:systemd python3:python3 \
  flock:util-linux chrt:util-linux ip:iproute2
ensure_packages psql:postgresql-client
# kubectl (client-go) reads the kubeconfigs the CLI merges.
ensure_packages kubectl:kubernetes-client
# What the node registry's images are built from (scripts/node-registry.sh): a static C
# toolchain, make and bzip2 for the sandbox image's pause and BusyBox, and the tools the conformance suite's agnhost
# runs; nsenter to enter a booted machine, iptables to show a booted node's rules when a
# workload check fails; HAProxy, the outside load balancer docs/apiserver-endpoint.md shows,
# and dnsmasq, the DNS server it follows the control plane's name through.
ensure_packages cc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev make:make bzip2:bzip2 \
  file:file curl:curl nc.openbsd:netcat-openbsd dig:bind9-dnsutils nsenter:util-linux iptables:iptables \
  haproxy:haproxy dnsmasq:dnsmasq-base
# Machines that boot (tests/src/machine.rs): the node image's root from Debian's packages, booted
# by systemd-nspawn with systemd as PID 1.
ensure_packages debootstrap:debootstrap systemd-nspawn:systemd-container \
  dpkg-scanpackages:dpkg-dev
ensure_postgres
ensure_postgres_server_binaries
# The databases an earlier run's tests left (each test makes its own and leaves it): dropped in
# the background (each drop is a checkpoint: minutes for a hundred on a busy machine), waited
# for before the tests.
drop_log=$(mktemp)
drop_test_databases >"$drop_log" 2>&1 &
drop_dbs=$!
export EXK8S_TEST_POSTGRES_URL="${EXK8S_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
ensure_venv_tool kubernetes-validate kubernetes-validate
export EXK8S_KUBERNETES_VALIDATE="$PWD/.venv/bin/kubernetes-validate"
# pyca/cryptography: a strict DER parser every certificate kind must pass (api/tests/it/pki.rs).
ensure_venv_module cryptography cryptography
export EXK8S_PYTHON="$PWD/.venv/bin/python"
# The console in a real browser (tests/tests/console.rs): Debian's Chromium and its
# chromedriver, Selenium, and axe-core for the accessibility check.
ensure_packages chromium:chromium chromedriver:chromium-driver
ensure_venv_module selenium selenium
EXK8S_AXE=$(ensure_axe)
export EXK8S_AXE

# The node image's root (Debian 12 with systemd), made by debootstrap, the local mirror of the
# Debian packages a node installs on it, CoreDNS from its Go module and BusyBox from its source
# (the registry's images follow once both are done): once per machine.
log "the node image's root and its package mirror (in the background; built once per machine)"
image_log=$(mktemp)
{
  bash scripts/node-image.sh >"$image_log.out" &&
    bash scripts/node-packages.sh "$(cat "$image_log.out")" >"$image_log.packages" &&
    bash scripts/node-registry.sh --tools
} 2>"$image_log" &
image_build=$!

# cargo-deny and mdBook, built once per machine, under SCHED_IDLE beside everything else: only
# idle cores.
log "cargo-deny and mdbook (in the background, SCHED_IDLE; the dependency graph is checked and the book built after the tests)"
deny_log=$(mktemp)
chrt --idle 0 nice -n 19 bash -c 'source scripts/lib/ensure.sh; ensure_check_tools' >"$deny_log" 2>&1 &
deny_install=$!

log "shellcheck (every script in the repository)"
git ls-files '*.sh' .ci/run | xargs shellcheck --severity=style --external-sources

log "cargo fmt --check"
cargo fmt --all --check

log "waiting for the linted build of the binaries and the booted clusters' test"
if ! wait "$rust_build"; then
  cat "$rust_log" >&2
  echo "cargo build failed (above)" >&2
  exit 1
fi
grep -vE '^ *(Compiling|Downloaded|Downloading|Checking|Blocking|Locking|Updating) ' "$rust_log" >&2 || true
boot_bin=$(python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "boot_cluster" and m.get("executable"):
        print(m["executable"])' <"$rust_log.json")
[ -x "$boot_bin" ] || { echo "the booted clusters' test binary was not built" >&2; exit 1; }

# Read with a Rust parser (tools/module-cycles; its made-up crate's traps are its unit tests).
log "no dependency circle between files or modules (tools/module-cycles)"
target/debug/module-cycles api/src agent/src cli/src capi/src common/src api-types/src tests/src loadgen/src \
  fuzz/src tools/module-cycles/src tools/cli-reference/src

if ! wait "$k8s_build"; then
  cat "$k8s_log" >&2
  echo "building Kubernetes, etcd or the S3 server failed (above)" >&2
  exit 1
fi
grep -E '^==> (k8s-binaries|e2e-binaries|s3-server)' "$k8s_log" >&2 || true
# Cluster API (its core controller and CRDs: tests/tests/capi/, beside the booted clusters),
# built from here in the background, niced, on the Go build cache the next minor just filled
# (its k8s.io modules are the same release's): the booted clusters wait for it only when they
# reach their Cluster API check before it is done (exk8s_tests::bins waits on its lock).
log "Cluster API $cluster_api_version from its Go module (in the background, niced; built once per machine)"
capi_log=$(mktemp)
nice -n 10 bash scripts/capi-binaries.sh >"$capi_log.out" 2>"$capi_log" &
capi_build=$!
EXK8S_ETCD_BIN=$(sed -n 1p "$k8s_log.out")
EXK8S_K8S_BIN=$(sed -n 2p "$k8s_log.out")
EXK8S_ETCD_NEXT_BIN=$(sed -n 1p "$k8s_log.next")
EXK8S_K8S_NEXT_BIN=$(sed -n 2p "$k8s_log.next")
EXK8S_S3_SERVER=$(cat "$k8s_log.s3")
EXK8S_E2E_TEST=$(sed -n 3p "$k8s_log.e2e")
export EXK8S_ETCD_BIN EXK8S_K8S_BIN EXK8S_ETCD_NEXT_BIN EXK8S_K8S_NEXT_BIN EXK8S_S3_SERVER EXK8S_E2E_TEST
if ! wait "$image_build"; then
  cat "$image_log" >&2
  echo "building the node image failed (above)" >&2
  exit 1
fi
grep -E '^==> node-(image|packages|registry)' "$image_log" >&2 || true
EXK8S_NODE_IMAGE=$(cat "$image_log.out")
EXK8S_NODE_PACKAGES=$(cat "$image_log.packages")
export EXK8S_NODE_IMAGE EXK8S_NODE_PACKAGES

# The registry booted machines pull from: the control plane's images from the Kubernetes
# binaries of both releases (an upgrade pulls the next), kube-proxy's with the node packages'
# iptables, CoreDNS's (filled once per machine). The registry itself, crane, helm and flanneld
# build first, in the next release's scratch module on the Go build cache it just filled
# (they share its client libraries).
log "the node registry's images"
registry_log=$(mktemp)
if ! registry_out=$(bash scripts/node-registry.sh "$EXK8S_K8S_BIN" "$EXK8S_K8S_NEXT_BIN" 2>"$registry_log"); then
  cat "$registry_log" >&2
  echo "filling the node registry failed (above)" >&2
  exit 1
fi
grep -E '^==> node-registry' "$registry_log" >&2 || true
EXK8S_NODE_REGISTRY=$(sed -n 1p <<<"$registry_out")
EXK8S_NODE_REGISTRY_STORE=$(sed -n 2p <<<"$registry_out")
EXK8S_NODE_HELM=$(sed -n 3p <<<"$registry_out")
export EXK8S_NODE_REGISTRY EXK8S_NODE_REGISTRY_STORE EXK8S_NODE_HELM

# The booted clusters (tests/tests/boot_cluster.rs: four real clusters, two at a time, about 30
# minutes, much of it waiting on real control planes) run from here beside everything after
# them: the rest of the build and of the suite runs niced (their waits are the booted machines'
# to take), and the checks after it. Their output is printed once they end; either failing fails
# the run. They run a copy of this commit's binaries (EXK8S_BIN_DIR): the builds beside them —
# every other target, and the previous release, whose binaries pass through target/debug/ —
# cannot change what a booted cluster runs.
mapfile -t booted_tests < <("$boot_bin" --list --format terse | sed -n 's/: test$//p')
[ "${#booted_tests[@]}" -gt 0 ] || { echo "$boot_bin lists no test" >&2; exit 1; }
booted_bins=$PWD/target/booted-bin
rm -rf "$booted_bins"
mkdir -p "$booted_bins"
cp target/debug/exk8s target/debug/exk8s-api target/debug/exk8s-agent target/debug/exk8s-capi "$booted_bins/"
log "the booted clusters: ${booted_tests[*]} (in the background from here; their output follows the other checks)"
boot_log=$(mktemp)
(cd tests && EXK8S_BIN_DIR=$booted_bins exec "$boot_bin") >"$boot_log" 2>&1 &
boot_lane=$!
boot_started=$SECONDS
# The lanes running in the background ("pid|output|what"): a check below that fails ends the
# run only once they have ended too (their processes and booted machines stop with them), each
# one's output shown, the last started first.
lanes=("$boot_lane|$boot_log|the booted clusters")
end_lanes() {
  local i pid out name
  for ((i = ${#lanes[@]} - 1; i >= 0; i--)); do
    IFS='|' read -r pid out name <<<"${lanes[i]}"
    if kill -0 "$pid" 2>/dev/null; then
      log "a check failed: waiting for $name to end"
      wait "$pid" || true
    fi
    cat "$out"
  done
}
trap end_lanes EXIT

log "cargo build with clippy's lints (warnings are errors): every other target, as cargo test resolves them (niced, beside the booted clusters)"
nice -n 10 "${linted[@]}" cargo build --workspace --locked --all-targets

# The previous release of exk8s (tests/tests/skew.rs runs its API and agent beside this one's):
# built from its commit into this target directory, only its own crates compiling, once per
# machine. Here, between the build above and the test build below, which puts this commit's
# binaries back in target/debug/.
log "the previous release's exk8s-api and exk8s-agent (scripts/previous-release.sh; once per machine; niced)"
EXK8S_PREVIOUS_BIN=$(nice -n 10 bash scripts/previous-release.sh)
export EXK8S_PREVIOUS_BIN

# Cluster API for the provider test, and then Go's caches are no longer needed.
if ! wait "$capi_build"; then
  cat "$capi_log" >&2
  echo "building Cluster API failed (above)" >&2
  exit 1
fi
grep -E '^==> capi-binaries' "$capi_log" >&2 || true
EXK8S_CAPI_BIN=$(sed -n 1p "$capi_log.out")
EXK8S_CAPI_CRDS=$(sed -n 2p "$capi_log.out")
export EXK8S_CAPI_BIN EXK8S_CAPI_CRDS

# Freed in the background (about 45 s for 12 GiB on a fresh machine, which the tests need not
# wait for); waited for before the checks after the tests.
go_clean=
if [ -d "$GOCACHE" ] || [ -d "$GOMODCACHE" ]; then
  log "freeing Go's build and module caches (in the background): every Go-built tool is cached in /var/cache/exk8s"
  nice -n 19 go clean -cache -modcache &
  go_clean=$!
fi
# Two booted clusters at once hold about 10 GiB of machine roots (a control-plane node's
# containerd keeps both releases' images), and the release builds grow target/ beside them.
free_gib=$(( $(df --output=avail -k / | tail -n 1) / 1024 / 1024 ))
log "disk: $free_gib GiB free on / for the tests, before Go's caches are freed"
if [ "$free_gib" -lt 16 ]; then
  log "WARNING: the booted tests need about 16 GiB free at their peak and $free_gib GiB is free: a full disk shows up as etcd or containerd exiting inside a machine"
fi

if ! wait "$drop_dbs"; then
  cat "$drop_log" >&2
  echo "dropping the databases earlier test runs left failed (above)" >&2
  exit 1
fi
cat "$drop_log" >&2

# The test targets, built (nothing is left to compile: the build above made them) before the
# tests start, which also puts this commit's exk8s-api and exk8s-agent back in target/debug/
# over the previous release's: the checks below package and run them.
log "cargo test --no-run (the test binaries; this commit's binaries back in target/debug/)"
nice -n 10 "${linted[@]}" cargo test --workspace --locked --no-run

# The suite runs in the background from here, beside the booted clusters, and the checks after
# it run beside it instead of after it (on a fresh machine they were a serial tail of about two
# minutes, half the cores idle). In two lanes: exk8s-tests' integration tests (real control
# planes, browsers and packages, mostly waiting on them: one after the other they were the last
# three minutes of a fresh machine's run, its cores four-fifths idle) beside every other test
# target. Both ask for the whole workspace (with test targets, as the build above did), so
# nothing compiles again; every test target is in one lane (checked), but the booted clusters'.
# Each lane's output is printed once it ends. Kept in files: a failing test's panic sits between
# its captured output (the real control-plane tests print every agent's log) and the other
# binaries' results, where a log cut to its head and tail loses it; on failure every panic is
# printed again, last.
mapfile -t suite_lanes < <(cargo metadata --locked --no-deps --format-version 1 | python3 -c '
import json, sys
boot = sys.argv[1]
packages = json.load(sys.stdin)["packages"]
def tests(keep):
    return {t["name"] for p in packages if keep(p["name"]) for t in p["targets"]
            if t["kind"] == ["test"] and t.get("test", True)}
integration = tests(lambda name: name == "exk8s-tests") - {boot}
other = tests(lambda name: name != "exk8s-tests")
both = integration & other
if both or not integration or not other:
    sys.exit(f"cannot split the suite into lanes: test targets {sorted(both)} are in exk8s-tests and elsewhere (or a lane is empty)")
print(" ".join(f"--test {t}" for t in sorted(integration)))
print(" ".join(f"--test {t}" for t in sorted(other)))' "$(basename "${boot_bin%-*}")")
[ "${#suite_lanes[@]}" -eq 2 ] || { echo "the suite's lanes could not be listed (cargo metadata, above)" >&2; exit 1; }
read -ra integration_tests <<<"${suite_lanes[0]}"
read -ra other_tests <<<"${suite_lanes[1]}"
suite=(nice -n 10 "${linted[@]}" cargo test --workspace --locked --no-fail-fast)
log "cargo test in two lanes beside the booted clusters, niced (their output follows the other checks): ${integration_tests[*]}; and the libraries, binaries and ${other_tests[*]}, then the doc tests"
unit_lane() {
  local rc=0
  "${suite[@]}" --lib --bins "${other_tests[@]}" || rc=1
  "${suite[@]}" --doc || rc=1
  return "$rc"
}
test_log=$(mktemp)
unit_lane >"$test_log" 2>&1 &
test_lane=$!
integration_log=$(mktemp)
"${suite[@]}" "${integration_tests[@]}" >"$integration_log" 2>&1 &
integration_lane=$!
tests_started=$SECONDS
lanes+=("$test_lane|$test_log|the unit tests and the API's and agent's" "$integration_lane|$integration_log|exk8s-tests' integration tests")

# The builds the packaging checks need, beside the tests under SCHED_IDLE: they take only the
# cores the tests leave idle (a real control plane waits on its components much of the time), so
# they never slow a test, and packaging later finds them built. Started only once the tests run: a
# cargo build holds the target directory's lock while it compiles, which one under SCHED_IDLE
# would hold against the builds above and `cargo test`'s own look at what is built (the tests
# themselves hold none). The packages are made from the
# dev profile (EXK8S_PACKAGE_PROFILE=dev): exk8s-api and exk8s are the binaries the build above
# made, and only the static agent compiles for its musl target — the checks are of what the
# packages hold, install and run, not of speed, and the release profile would compile every
# dependency a second time (the longest build of a fresh machine's run).
# `scripts/package.sh` run by itself builds with the release profile as it ships.
export EXK8S_PACKAGE_PROFILE=dev
log "the static agent and cargo-deb for packaging (in the background, SCHED_IDLE: only idle cores)"
release_log=$(mktemp)
until { grep -q '^ *Running ' "$test_log" || ! kill -0 "$test_lane" 2>/dev/null; } &&
  { grep -q '^ *Running ' "$integration_log" || ! kill -0 "$integration_lane" 2>/dev/null; }; do sleep 1; done
chrt --idle 0 nice -n 19 bash scripts/release-builds.sh >"$release_log" 2>&1 &
release_builds=$!

if [ -n "$go_clean" ] && ! wait "$go_clean"; then
  echo "freeing Go's caches (go clean -cache -modcache) failed (above)" >&2
  exit 1
fi

log "schemathesis against the served OpenAPI document (bounded, fixed seed; niced, beside the tests)"
EXK8S_API_BIN=target/debug/exk8s-api nice -n 10 bash scripts/api-fuzz.sh \
  "${EXK8S_SCHEMATHESIS_EXAMPLES:-50}" "${EXK8S_SCHEMATHESIS_SEED:-20261122}"

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

log "waiting for the packaging builds"
if ! wait "$release_builds"; then
  cat "$release_log" >&2
  echo "the builds for packaging failed (above)" >&2
  exit 1
fi
grep -E '^==> ' "$release_log" >&2 || true

log "packaging: static agent, image bake, unit verification (niced, beside the tests)"
nice -n 10 bash scripts/test-packaging.sh

log "Debian packages: lintian, install, files and units, remove and purge (niced, beside the tests)"
nice -n 10 bash scripts/test-deb.sh

log "waiting for the test suite (running for $(( (SECONDS - tests_started) / 60 )) min)"
failed=()
wait "$test_lane" || failed+=("cargo test (the unit tests, the API's and agent's)")
wait "$integration_lane" || failed+=("cargo test (exk8s-tests' integration tests)")
log "waiting for the booted clusters (running for $(( (SECONDS - boot_started) / 60 )) min)"
wait "$boot_lane" || failed+=("the booted clusters ($boot_bin)")
trap - EXIT
cat "$test_log"
tee -a "$test_log" <"$integration_log"
tee -a "$test_log" <"$boot_log"
if [ "${#failed[@]}" -gt 0 ]; then
  log "failed: ${failed[*]}; the panics, again:"
  grep -E -A 14 '^thread .* panicked at ' "$test_log" | cut -c1-2000 >&2 || true
  grep -E '^---- |^error: .* target' "$test_log" >&2 || true
  exit 1
fi

log "all checks passed"

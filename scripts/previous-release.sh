#!/usr/bin/env bash
# The previous release's exk8s-api and exk8s-agent (scripts/lib/versions.sh's previous_release),
# built from that commit of this repository in a git worktree into this workspace's target
# directory — so only the workspace's own crates compile, the dependencies are this build's —
# then copied into /var/cache/exk8s/previous/<commit>/: once per machine. Prints that directory.
#
# Run it when nothing else builds this workspace: its binaries pass through target/debug/, and
# the next cargo build here puts this commit's back (scripts/test.sh runs it between its build
# and `cargo test --no-run`).
#
#   scripts/previous-release.sh    # -> /var/cache/exk8s/previous/<commit>
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh
# shellcheck source=scripts/lib/versions.sh
source scripts/lib/versions.sh

commit=$previous_release
out=/var/cache/exk8s/previous/$commit
if [ -x "$out/exk8s-api" ] && [ -x "$out/exk8s-agent" ]; then
  log "previous release ${commit:0:12}: cached in $out"
  echo "$out"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  # A shallow clone: ask its origin for the one commit.
  git fetch --quiet --depth 1 origin "$commit" 2>/dev/null || true
fi
git cat-file -e "$commit^{commit}" 2>/dev/null || {
  echo "the previous release's commit $commit is not in this clone's history, nor could it be fetched from origin (git fetch --unshallow)" >&2
  exit 1
}
workspace=$PWD
tree=$(mktemp -d)
cleanup() { git -C "$workspace" worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"; }
trap cleanup EXIT
git worktree add --detach --force "$tree" "$commit" >/dev/null 2>&1
log "building the previous release's exk8s-api and exk8s-agent (${commit:0:12}, into this workspace's target/)"
started=$SECONDS
# Cargo names a workspace crate's artifacts by its path inside the workspace, so this commit's
# crates would take the names of this workspace's and overwrite them (and their fingerprints:
# the next build here would find them fresh). A profile setting of their own (one codegen unit
# fewer, nothing else) gives them their own names; the dependencies keep theirs and are shared.
own=()
for crate in exk8s-common exk8s-api-types exk8s-api exk8s-agent; do
  own+=(--config "profile.dev.package.$crate.codegen-units=255")
done
messages=$(cd "$tree" && cargo build --locked --workspace --bin exk8s-api --bin exk8s-agent \
  "${own[@]}" --target-dir "$workspace/target" --message-format=json-render-diagnostics)
mkdir -p "$out.partial"
for name in exk8s-api exk8s-agent; do
  built=$(python3 -c 'import json, sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])' "$name" <<<"$messages")
  [ -x "$built" ] || { echo "the previous release's $name was not built" >&2; exit 1; }
  cp "$built" "$out.partial/$name"
done
rm -rf "$out"
mv "$out.partial" "$out"
log "previous release ${commit:0:12}: made in $((SECONDS - started)) s in $out"
echo "$out"

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
# The dependencies are this build's only while they compile with this build's profile: one
# setting apart (the commit's `debug` for every dependency, where .ci/run's environment turns
# it off for this build) and cargo compiles every one of them again, C libraries included —
# 22 minutes of a fresh machine's run (2026-12-06). So the commit's [profile] tables give way
# to this workspace's; its code, dependencies and lock file stay as released.
python3 - "$workspace/Cargo.toml" "$tree/Cargo.toml" <<'PY'
import sys, tomllib
ours, theirs = (open(path, encoding="utf-8").read() for path in sys.argv[1:])
def split(text, name):
    lines = text.splitlines(keepends=True)
    first = next((i for i, l in enumerate(lines) if l.startswith("[profile")), None)
    if first is None:
        sys.exit(f"{name}: no [profile] table")
    return "".join(lines[:first]), "".join(lines[first:])
head, _ = split(theirs, sys.argv[2])
_, profiles = split(ours, sys.argv[1])
merged = head + profiles
m, o, t = (tomllib.loads(x) for x in (merged, ours, theirs))
# Every table after the first [profile] header is a profile (checked, with a TOML parser).
if m.get("profile") != o.get("profile") or {k: v for k, v in m.items() if k != "profile"} != {
        k: v for k, v in t.items() if k != "profile"}:
    sys.exit(f"{sys.argv[2]}: its [profile] tables are not the file's last part; cannot give it this workspace's")
open(sys.argv[2], "w", encoding="utf-8").write(merged)
PY
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
# Its dependencies should have been found built by this workspace's build (scripts/test.sh
# runs it after one); those compiled here say that a profile or features differ.
compiled=$(python3 -c 'import json, sys
tree = sys.argv[1]
names = sorted({m["target"]["name"] for m in map(json.loads, sys.stdin)
                if m.get("reason") == "compiler-artifact" and not m.get("fresh")
                and not m.get("manifest_path", "").startswith(tree + "/")})
shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
print("%d (%s)" % (len(names), shown) if names else "none")' "$tree" <<<"$messages")
log "previous release ${commit:0:12}: made in $((SECONDS - started)) s in $out; dependencies compiled for it: $compiled"
echo "$out"

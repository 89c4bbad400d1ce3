#!/usr/bin/env bash
# Packaging checks (run by scripts/test.sh): the static agent build, the image bake, and the
# agent's unit verified by systemd-analyze inside the baked root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

bash scripts/build-static-agent.sh
package_profile
agent=target/x86_64-unknown-linux-musl/$package_dir/exk8s-agent
"$agent" --version
"$agent" --help | grep -q "Exit codes:"
"$agent" sync --help | grep -q -- "--api-url"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
bash packaging/bake-image.sh "$root" --agent "$agent" --keys-dir common/tests/data/trusted-keys
for path in usr/bin/exk8s-agent etc/systemd/system/exk8s-agent.service \
  etc/systemd/system/exk8s-agent-sync.service etc/systemd/system/exk8s-agent-sync.timer \
  etc/exk8s/trusted-keys.d/test-key.pub; do
  [ -e "$root/$path" ] || { echo "bake-image.sh did not install $path" >&2; exit 1; }
done
[ "$(readlink "$root/etc/systemd/system/multi-user.target.wants/exk8s-agent.service")" = ../exk8s-agent.service ] \
  || { echo "the agent unit is not enabled" >&2; exit 1; }
[ "$(readlink "$root/etc/systemd/system/timers.target.wants/exk8s-agent-sync.timer")" = ../exk8s-agent-sync.timer ] \
  || { echo "the sync timer is not enabled" >&2; exit 1; }
[ "$(stat -c %a "$root/usr/bin/exk8s-agent")" = 755 ] || { echo "agent mode" >&2; exit 1; }

mkdir -p "$root/usr/lib/systemd"
cp -r /usr/lib/systemd/system "$root/usr/lib/systemd/"
# The units' ExecCondition runs grep (skipped until agent.toml names the API).
install -D -m 0755 "$(command -v grep)" "$root/usr/bin/grep"
for unit in exk8s-agent.service exk8s-agent-sync.service exk8s-agent-sync.timer; do
  said=$(systemd-analyze verify --root="$root" "/etc/systemd/system/$unit" 2>&1) \
    || { echo "$unit: $said" >&2; exit 1; }
  [ -z "$said" ] || { echo "systemd-analyze verify warned on $unit: $said" >&2; exit 1; }
done

# The baked agent verifies a bundle with the baked keys.
"$root/usr/bin/exk8s-agent" --keys-dir "$root/etc/exk8s/trusted-keys.d" \
  verify --bundle common/tests/data/valid/envelope.json --at 1767225700
echo "packaging checks passed"

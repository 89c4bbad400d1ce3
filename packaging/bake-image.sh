#!/usr/bin/env bash
# Installs exk8s-agent into a VM image's root directory:
#   the binary, its systemd units (boot unit and sync timer, enabled), the trusted bundle-signing keys, an optional
#   agent.toml, and optionally the node artifacts pre-installed from a signed bundle.
#
#   packaging/bake-image.sh ROOT --agent BIN --keys-dir DIR [--config agent.toml] [--prereqs-bundle FILE]
set -euo pipefail

usage() {
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 1 ] || usage
root=$1
shift
agent="" keys="" config="" bundle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) agent=${2:?--agent needs a path}; shift 2 ;;
    --keys-dir) keys=${2:?--keys-dir needs a directory}; shift 2 ;;
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --prereqs-bundle) bundle=${2:?--prereqs-bundle needs a file}; shift 2 ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
if [ -z "$agent" ] || [ ! -x "$agent" ]; then
  echo "--agent must name the exk8s-agent binary" >&2
  exit 2
fi
if [ -z "$keys" ] || [ ! -d "$keys" ]; then
  echo "--keys-dir must name a directory of *.pub keys" >&2
  exit 2
fi
if [ ! -d "$root" ]; then
  echo "image root $root does not exist" >&2
  exit 2
fi
shopt -s nullglob
pubs=("$keys"/*.pub)
[ ${#pubs[@]} -gt 0 ] || { echo "no *.pub key in $keys" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
install -D -m 0755 "$agent" "$root/usr/bin/exk8s-agent"
install -D -m 0644 "$here/exk8s-agent.service" "$root/etc/systemd/system/exk8s-agent.service"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sfn ../exk8s-agent.service "$root/etc/systemd/system/multi-user.target.wants/exk8s-agent.service"
install -m 0644 "$here/exk8s-agent-sync.service" "$here/exk8s-agent-sync.timer" "$root/etc/systemd/system/"
mkdir -p "$root/etc/systemd/system/timers.target.wants"
ln -sfn ../exk8s-agent-sync.timer "$root/etc/systemd/system/timers.target.wants/exk8s-agent-sync.timer"
install -d -m 0755 "$root/etc/exk8s/trusted-keys.d"
for key in "${pubs[@]}"; do
  install -m 0644 "$key" "$root/etc/exk8s/trusted-keys.d/"
done
if [ -n "$config" ]; then
  install -D -m 0644 "$config" "$root/etc/exk8s/agent.toml"
fi
if [ -n "$bundle" ]; then
  "$agent" --keys-dir "$keys" prereqs --bundle "$bundle" --root "$root"
fi
echo "baked exk8s-agent into $root (${#pubs[@]} trusted key(s))"

#!/usr/bin/env bash
# Debian package checks (run by scripts/test.sh, as root): builds the three packages, runs lintian,
# installs them into this machine with dpkg, checks files, modes, owners, conffiles, the system
# user and the units (systemd-analyze verify, and the API's exposure score from
# `systemd-analyze security --offline=yes`), then removes and purges them as Debian policy says.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

# The highest exposure `systemd-analyze security` may give the API's unit ("OK" is below 2.0).
max_exposure=2.0

fail() {
  echo "package check failed: $*" >&2
  exit 1
}

ensure_packages lintian:lintian
bash scripts/package.sh
api_deb=$(ls target/debian/exk8s-api_*.deb)
agent_deb=$(ls target/debian/exk8s-agent_*.deb)
cli_deb=$(ls target/debian/exk8s-cli_*.deb)
capi_deb=$(ls target/debian/exk8s-capi_*.deb)

log "lintian (errors fail)"
for deb in "$api_deb" "$agent_deb" "$cli_deb" "$capi_deb"; do
  lintian --fail-on error "$deb"
done

# A clean slate: an earlier run on this machine may have left them installed.
as_root dpkg --purge exk8s-api exk8s-agent exk8s-cli exk8s-capi >/dev/null 2>&1 || true

log "installing the packages with dpkg"
as_root dpkg -i "$api_deb" "$agent_deb" "$cli_deb" "$capi_deb"

# expect PATH MODE OWNER GROUP
expect() {
  [ -e "$1" ] || fail "$1 is not installed"
  local got
  got=$(stat -c '%a %U %G' "$1")
  [ "$got" = "$2 $3 $4" ] || fail "$1 is $got, not $2 $3 $4"
}
unit_dir=/usr/lib/systemd/system
[ -e "$unit_dir/exk8s-api.service" ] || unit_dir=/lib/systemd/system
expect /usr/bin/exk8s-api 755 root root
expect /usr/bin/exk8s-agent 755 root root
expect /usr/bin/exk8s 755 root root
expect /usr/bin/exk8s-capi 755 root root
expect /usr/share/doc/exk8s-capi/cluster-api.md 644 root root
/usr/bin/exk8s-capi --version | grep -q "^exk8s-capi " || fail "the installed exk8s-capi does not run"
/usr/bin/exk8s-capi crds | grep -q "kind: ExK8sControlPlane" || fail "exk8s-capi crds prints no ExK8sControlPlane CRD"
expect /usr/share/bash-completion/completions/exk8s 644 root root
expect /usr/share/zsh/vendor-completions/_exk8s 644 root root
expect /usr/share/fish/vendor_completions.d/exk8s.fish 644 root root
grep -q "clusters" /usr/share/bash-completion/completions/exk8s || fail "empty bash completions"
/usr/bin/exk8s --version | grep -q "^exk8s " || fail "the installed exk8s does not run"
expect /etc/exk8s/api.env 600 root root
expect /etc/exk8s/agent.toml 644 root root
expect "$unit_dir/exk8s-api.service" 644 root root
expect "$unit_dir/exk8s-capi.service" 644 root root
expect "$unit_dir/exk8s-agent.service" 644 root root
expect "$unit_dir/exk8s-agent-sync.service" 644 root root
expect "$unit_dir/exk8s-agent-sync.timer" 644 root root
expect /var/lib/exk8s 700 exk8s exk8s
expect /etc/exk8s/credentials 700 root root

user=$(getent passwd exk8s) || fail "no exk8s system user"
uid=$(echo "$user" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "exk8s is not a system user (uid $uid)"
case "$(echo "$user" | cut -d: -f7)" in
  */nologin | */false) ;;
  *) fail "the exk8s user can log in: $user" ;;
esac

dpkg-query -W -f='${Conffiles}\n' exk8s-api | grep -q '^ /etc/exk8s/api.env ' \
  || fail "/etc/exk8s/api.env is not a conffile of exk8s-api"
dpkg-query -W -f='${Conffiles}\n' exk8s-agent | grep -q '^ /etc/exk8s/agent.toml ' \
  || fail "/etc/exk8s/agent.toml is not a conffile of exk8s-agent"

# Every setting of `serve` is in api.env, commented, so an operator finds each one there.
for var in $(/usr/bin/exk8s-api serve --help | grep -o 'env: EXK8S_[A-Z0-9_]*' | sed 's/env: //'); do
  grep -q "^# $var=" /etc/exk8s/api.env || fail "api.env does not mention $var"
done

# The agent's boot unit and sync timer are enabled for images; the API waits for its operator.
[ -L /etc/systemd/system/multi-user.target.wants/exk8s-agent.service ] \
  || fail "exk8s-agent.service is not enabled"
[ -L /etc/systemd/system/timers.target.wants/exk8s-agent-sync.timer ] \
  || fail "exk8s-agent-sync.timer is not enabled"
[ ! -e /etc/systemd/system/multi-user.target.wants/exk8s-api.service ] \
  || fail "exk8s-api.service is enabled before it is configured"
[ ! -e /etc/systemd/system/multi-user.target.wants/exk8s-capi.service ] \
  || fail "exk8s-capi.service is enabled before it is configured"

log "systemd-analyze verify (every installed unit)"
for unit in exk8s-api.service exk8s-capi.service exk8s-agent.service exk8s-agent-sync.service exk8s-agent-sync.timer; do
  said=$(systemd-analyze verify "$unit_dir/$unit" 2>&1) || fail "$unit: $said"
  [ -z "$said" ] || fail "systemd-analyze verify warned on $unit: $said"
done

log "systemd-analyze security (exposure)"
exposure() {
  systemd-analyze security --offline=yes "$unit_dir/$1" 2>&1 \
    | sed -n "s/.*Overall exposure level for $1: \([0-9.]*\).*/\1/p"
}
api_exposure=$(exposure exk8s-api.service)
capi_exposure=$(exposure exk8s-capi.service)
agent_exposure=$(exposure exk8s-agent.service)
[ -n "$api_exposure" ] || fail "no exposure score for exk8s-api.service"
[ -n "$capi_exposure" ] || fail "no exposure score for exk8s-capi.service"
echo "exposure: exk8s-api.service $api_exposure, exk8s-capi.service $capi_exposure (each at most $max_exposure), exk8s-agent.service $agent_exposure (runs as root)"
within_exposure() {
  awk -v got="$2" -v max="$max_exposure" 'BEGIN { exit !(got <= max) }' \
    || fail "$1 exposure $2 is above $max_exposure"
}
within_exposure exk8s-api.service "$api_exposure"
within_exposure exk8s-capi.service "$capi_exposure"

log "keys straight into the credentials directory the unit reads"
as_root /usr/bin/exk8s-api keys generate-kek --out /etc/exk8s/credentials/kek >/dev/null
as_root /usr/bin/exk8s-api keys generate --out /etc/exk8s/credentials/signing-key >/dev/null
expect /etc/exk8s/credentials/kek 600 root root
expect /etc/exk8s/credentials/signing-key 600 root root
echo "state" | as_root tee /var/lib/exk8s/marker >/dev/null

log "remove: binaries and units go; state, keys and conffiles stay"
as_root dpkg --remove exk8s-api exk8s-agent exk8s-cli exk8s-capi
for gone in /usr/bin/exk8s-api /usr/bin/exk8s-agent /usr/bin/exk8s /usr/bin/exk8s-capi \
  "$unit_dir/exk8s-api.service" "$unit_dir/exk8s-capi.service" \
  "$unit_dir/exk8s-agent.service" "$unit_dir/exk8s-agent-sync.timer"; do
  [ ! -e "$gone" ] || fail "$gone is still there after remove"
done
for kept in /var/lib/exk8s/marker /etc/exk8s/api.env /etc/exk8s/agent.toml /etc/exk8s/credentials/kek; do
  [ -e "$kept" ] || fail "$kept went with remove"
done

log "purge: state and conffiles go; keys an operator made stay"
as_root dpkg --purge exk8s-api exk8s-agent exk8s-cli exk8s-capi
for gone in /var/lib/exk8s /etc/exk8s/api.env /etc/exk8s/agent.toml \
  /etc/systemd/system/multi-user.target.wants/exk8s-agent.service; do
  [ ! -e "$gone" ] || fail "$gone is still there after purge"
done
[ -e /etc/exk8s/credentials/kek ] || fail "purge deleted the operator's KEK"
as_root rm -rf /etc/exk8s/credentials
as_root rmdir --ignore-fail-on-non-empty /etc/exk8s
echo "package checks passed"

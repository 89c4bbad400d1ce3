# shellcheck shell=bash
# A scratch registry (distribution's `registry serve`) that fills a store on disk: the images
# node-registry.sh and conformance-images.sh push are written into DATA, then served read-only
# by the tests' own registries. The caller defines `die MESSAGE`.

# scratch_registry_start REGISTRY DATA WORK: serves DATA on a free loopback port with the
# `registry` binary REGISTRY (its config and log in WORK), and returns once it listens; sets
# scratch_registry_port. Stopped by scratch_registry_stop, or when the script exits.
scratch_registry_start() {
  local registry=$1 data=$2 work=$3 tries=0
  scratch_registry_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$work/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $data
http:
  addr: 127.0.0.1:$scratch_registry_port
EOF
  "$registry" serve "$work/config.yml" >"$work/registry.log" 2>&1 &
  scratch_registry_pid=$!
  trap 'kill "$scratch_registry_pid" 2>/dev/null || true' EXIT
  until python3 -c "import socket; socket.create_connection(('127.0.0.1', $scratch_registry_port), 1)" 2>/dev/null; do
    tries=$((tries + 1))
    [ $tries -lt 100 ] || die "the scratch registry never listened: $(tail -n 5 "$work/registry.log")"
    kill -0 "$scratch_registry_pid" 2>/dev/null || die "the scratch registry exited: $(tail -n 5 "$work/registry.log")"
    sleep 0.1
  done
}

# scratch_registry_stop: stops the registry scratch_registry_start started.
scratch_registry_stop() {
  kill "$scratch_registry_pid"
  wait "$scratch_registry_pid" 2>/dev/null || true
  trap - EXIT
}

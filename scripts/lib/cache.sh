# shellcheck shell=bash
# Build-once caches shared by the scripts that fill /var/cache/exk8s (k8s-binaries.sh,
# node-registry.sh). The caller defines `log MESSAGE`.

# The environment every Go build of a tool here runs in: no cgo, modules resolved as needed, the
# local toolchain, no DWARF (nobody debugs these builds), and a collector that runs a quarter as
# often (GOGC=400: etcd's build took 10-15 % fewer CPU-seconds than at Go's default, alternated
# on this 2-core machine, 2026-12-05; its largest process 365 MB instead of 247). GOGC does not
# enter Go's build cache keys: builds at either setting share it.
go_env=(CGO_ENABLED=0 "GOFLAGS=-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local GOGC=400)

# gomod GO-ARGS...: go with go_env.
gomod() { env "${go_env[@]}" go "$@"; }

# with_lock DIR FUNCTION: runs `FUNCTION DIR` once per DIR (made empty first), under an
# exclusive lock on DIR.lock, unless DIR/.done says an earlier run finished; safe when several
# callers ask at once.
with_lock() {
  local dir=$1 fn=$2 fd
  exec {fd}>"$dir.lock"
  flock "$fd"
  if [ -f "$dir/.done" ]; then
    log "$(basename "$dir"): cached in $dir"
  else
    rm -rf "$dir"
    mkdir -p "$dir"
    local started=$SECONDS
    "$fn" "$dir"
    touch "$dir/.done"
    log "$(basename "$dir"): made in $((SECONDS - started)) s in $dir"
  fi
  flock -u "$fd"
  exec {fd}>&-
}

# shellcheck shell=bash
# The dev stack with booted machines (scripts/dev-cluster.sh) for a script that drives it:
# `start_dev_stack OUT PORT [dev-cluster.sh arguments]` starts it in its own session, its data in
# OUT/stack and its log in OUT/stack.log, and returns once its API answers on 127.0.0.1:PORT
# (exiting with the log's end if the stack ends first); `stop_dev_stack` stops it (its machines
# power off; after 180 s it is killed). A script calls stop_dev_stack from its EXIT trap. Needs
# `log` from scripts/lib/ensure.sh.

dev_stack_pid=''

start_dev_stack() {
  local out=$1 port=$2
  shift 2
  log "the dev stack with booted machines on 127.0.0.1:$port (its log: $out/stack.log)"
  rm -rf "$out/stack" "$out/cli"
  setsid bash scripts/dev-cluster.sh --data-dir "$out/stack" --port "$port" "$@" >"$out/stack.log" 2>&1 &
  dev_stack_pid=$!
  until [ -f "$out/stack/operator.token" ] && curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
    kill -0 "$dev_stack_pid" 2>/dev/null || {
      tail -n 30 "$out/stack.log" >&2
      echo "the stack ended (its log: $out/stack.log)" >&2
      exit 1
    }
    sleep 2
  done
}

stop_dev_stack() {
  if [ -n "$dev_stack_pid" ] && kill -0 "$dev_stack_pid" 2>/dev/null; then
    log "stopping the stack (its machines power off)"
    kill -INT -- "-$dev_stack_pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$dev_stack_pid" 2>/dev/null && [ "$waited" -lt 180 ]; do sleep 1; waited=$((waited + 1)); done
    kill -KILL -- "-$dev_stack_pid" 2>/dev/null || true
  fi
}

# Sourced by the server test scripts: start NAME ARGS... runs `$Q serve --port 0 ARGS`,
# waits for its "listening on" line and sets PORT_NAME and PID_NAME; stop_servers ends them with SIGTERM
# and fails unless each exits 0 (under ASan a leak is a nonzero exit); any still running
# at exit are killed; ok / bad / check count checks.
# ok / bad / check COND WHAT count checks into $pass / $fail (cli_server.sh reports them).
pass=${pass:-0} fail=${fail:-0}
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
stop_servers() {
  local rc=0 p st
  for p in "${PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null
    st=0; wait "$p" || st=$?
    if [ "$st" != 0 ]; then echo "FAIL: server $p exited $st on SIGTERM" >&2; rc=1; fi
  done
  PIDS=()
  return $rc
}
start() {
  local name=$1; shift
  "$Q" serve --port 0 -q "$@" >"$T/$name.out" 2>"$T/$name.err" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 300); do
    if grep -q "listening on" "$T/$name.out" 2>/dev/null; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  local port
  port=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$T/$name.out")
  if [ -z "$port" ]; then
    echo "FAIL: server $name did not start" >&2
    cat "$T/$name.err" >&2
    exit 1
  fi
  eval "PORT_$name=$port PID_$name=$pid"
}

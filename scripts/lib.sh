# Shell helpers shared by the launch and benchmark scripts (sourced, not run).

# An unused TCP port on 127.0.0.1 (bound and released; use it at once).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# `free_ports N`: the first of N consecutive ports that are free now (for SYNCOPATE_PS_PORT, whose
# shards take PORT, PORT+1, ...); a port derived from another one may be in use by anything.
free_ports() {
  python3 - "$1" <<'PYEOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(20000, 60000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    break
else:
    sys.exit("free_ports: no run of free ports found")
PYEOF
}

# Process groups. `spawn CMD...` starts CMD in the background in a session and process group of
# its own (setsid; the caller must not use job control, else setsid forks and the PID is not the
# group) and appends its PID, which is the group's ID, to SPAWNED. Everything CMD starts (the
# worker of launch_node.sh, the child of `ip netns exec`) stays in that group, so `end_spawned`
# ends all of it: SIGTERM, up to 5 s to exit, then SIGKILL. Safe to call twice.
SPAWNED=()
spawn() {
  setsid "$@" &
  SPAWNED+=($!)
}
end_spawned() {
  local p t alive
  for p in "${SPAWNED[@]:-}"; do [ -n "$p" ] && { kill -TERM -- "-$p" 2>/dev/null || true; }; done
  for t in $(seq 1 50); do
    alive=0
    for p in "${SPAWNED[@]:-}"; do [ -n "$p" ] && kill -0 -- "-$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${SPAWNED[@]:-}"; do [ -n "$p" ] && { kill -KILL -- "-$p" 2>/dev/null || true; }; done
  wait 2>/dev/null || true
  return 0
}

# The build's environment, set up first if this checkout has none (scripts/setup.sh): the paths in
# .syncopate-env (TORCH_PREFIX, PYTHON) and ccache's settings. Call from $ROOT (build.sh, asan_check.sh).
build_env() {
  [ -f .syncopate-env ] || scripts/setup.sh
  # shellcheck disable=SC1091
  source .syncopate-env
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
  # Paths under the checkout are hashed relative to it, so a second worktree of the repository
  # (another branch) reuses this one's cached objects instead of compiling everything again.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
}

# Shell helpers shared by the launch and benchmark scripts (sourced, not run).

# An unused TCP port on 127.0.0.1 (bound and released; use it at once).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Emulated hosts on one machine (sourced by local_cluster.sh and bench_allreduce.sh; needs root).
#   netns_up PREFIX N GBIT   N namespaces PREFIXn0..n{N-1} at 10.77.0.1..N/24, each joined to a bridge
#                            namespace PREFIXbr by a veth pair rate-limited to GBIT Gbit/s (tbf qdisc
#                            on both ends, so each host's link is GBIT in each direction)
#   netns_run PREFIX I CMD.. runs CMD inside host I
# SYNCOPATE_TBF_QUEUE_MS (default 50): how long a packet may wait in a link's tbf queue before it is
# dropped (the queue's size is this x the rate); a diagnostic knob, the studies use the default.
# SYNCOPATE_TBF_BURST_MS (default 8): the tbf bucket, in ms of the rate (at least 16 KiB): what a link
# that was idle passes at the veth's speed. 8 ms is a third to a half of the micro proxy's 0.5 MB model
# at 0.15-0.25 Gbit/s, which no real NIC does (docs/STUDY.md, session 42); the studies so far use 8.
#   netns_stats PREFIX N     prints each node's tbf counters and TCP retransmissions (before netns_down)
#   netns_down PREFIX N      removes them (veths go with their namespaces)
# netem is not available on these machines: latency/slowness is modelled elsewhere.
netns_up() {
  local p=$1 n=$2 gbit=$3 i rate burst
  # Up front, before anything is created or started: namespaces, veths and qdiscs need root.
  if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): --netns needs root (it creates network namespaces and tc qdiscs, as user $(id -un) cannot):" \
         "run it as root (sudo -E $0 ...), or drop --netns / --link-gbit" >&2
    exit 2
  fi
  # GBIT may be a fraction (an emulated slow link, e.g. 0.0228): tc gets kbit/s, and a bucket of
  # SYNCOPATE_TBF_BURST_MS at that rate (at least 16 KiB).
  local burst_ms=${SYNCOPATE_TBF_BURST_MS:-8}
  case $burst_ms in
    ''|*[!0-9.]*|*.*.*) echo "$(basename "$0"): SYNCOPATE_TBF_BURST_MS=$burst_ms is not a number of ms (e.g. 1 or 0.5)" >&2
                        exit 2;;
  esac
  rate="$(awk -v g="$gbit" 'BEGIN { r = int(g * 1000000 + 0.5); if (r < 8) r = 8; print r "kbit" }')"
  burst="$(awk -v g="$gbit" -v ms="$burst_ms" 'BEGIN { b = int(g * 1e9 / 8 * ms / 1000); if (b < 16384) b = 16384; print b }')"
  ip netns add "${p}br"
  ip -n "${p}br" link add br0 type bridge
  ip -n "${p}br" link set br0 up
  for i in $(seq 0 $((n - 1))); do
    ip netns add "${p}n$i"
    ip link add "${p}v$i" type veth peer name "${p}b$i"
    ip link set "${p}v$i" netns "${p}n$i"
    ip link set "${p}b$i" netns "${p}br"
    ip -n "${p}n$i" addr add "10.77.0.$((i + 1))/24" dev "${p}v$i"
    ip -n "${p}n$i" link set "${p}v$i" up
    ip -n "${p}n$i" link set lo up
    ip -n "${p}br" link set "${p}b$i" master br0
    ip -n "${p}br" link set "${p}b$i" up
    ip netns exec "${p}n$i" tc qdisc add dev "${p}v$i" root tbf rate "$rate" burst "$burst" latency "${SYNCOPATE_TBF_QUEUE_MS:-50}ms"
    ip netns exec "${p}br" tc qdisc add dev "${p}b$i" root tbf rate "$rate" burst "$burst" latency "${SYNCOPATE_TBF_QUEUE_MS:-50}ms"
  done
}
netns_run() {
  local p=$1 i=$2
  shift 2
  ip netns exec "${p}n$i" "$@"
}
# Per node, its links' tbf counters (bytes sent, packets dropped, overlimits, both directions) and
# its TCP retransmissions and timeouts, one line each: what the kernel did to the traffic (a drop is
# a retransmission, and an RTO of 200 ms or more, that no link model of bytes over rate has).
netns_stats() {
  local p=$1 n=$2 i
  for i in $(seq 0 $((n - 1))); do
    echo "node $i uplink: $(ip netns exec "${p}n$i" tc -s qdisc show dev "${p}v$i" 2>&1 | tr -s ' \n' ' ')"
    echo "node $i downlink: $(ip netns exec "${p}br" tc -s qdisc show dev "${p}b$i" 2>&1 | tr -s ' \n' ' ')"
    echo "node $i tcp: $(ip netns exec "${p}n$i" nstat -az TcpOutSegs TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPLossProbes 2>&1 |
      awk 'NR > 1 {printf "%s=%s ", $1, $2}')"
  done
}
netns_down() {
  local p=$1 n=$2 i
  for i in $(seq 0 $((n - 1))); do ip netns del "${p}n$i" 2>/dev/null || true; done
  ip netns del "${p}br" 2>/dev/null || true
}

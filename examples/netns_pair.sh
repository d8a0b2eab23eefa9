#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair, with optional
# tc tbf rate limiting (netem is not available on every kernel; tbf is).
#
#   examples/netns_pair.sh up              create  <P>-a (10.77.0.1) <-veth-> <P>-b (10.77.0.2)
#   examples/netns_pair.sh down            delete both namespaces (and the veth with them)
#   examples/netns_pair.sh slow RATE       limit egress on both ends, e.g. 'slow 10mbit' / '1gbit'
#   examples/netns_pair.sh restore         remove the rate limit
#   examples/netns_pair.sh status          show namespaces, addresses, qdiscs
#   examples/netns_pair.sh exec a|b CMD... run CMD inside namespace a or b
#
# Environment (so several users on one machine do not collide):
#   REVEAL_NETNS_PREFIX  name prefix of the namespaces and veth ends (default: reveal; the veth
#                        names are cut to 15 characters, so keep the prefix ≤ 10 characters)
#   REVEAL_NETNS_SUBNET  first three octets of the /24 used (default: 10.77.0)
# Every command is idempotent: 'up' on an existing pair, 'down' on a missing one, 'restore'
# without a limit all succeed.  Needs root (CAP_NET_ADMIN) and iproute2.
set -euo pipefail

PREFIX="${REVEAL_NETNS_PREFIX:-reveal}"
SUBNET="${REVEAL_NETNS_SUBNET:-10.77.0}"
NS_A="${PREFIX}-a"
NS_B="${PREFIX}-b"
VETH_A="${PREFIX:0:10}-va"
VETH_B="${PREFIX:0:10}-vb"
IP_A="${SUBNET}.1"
IP_B="${SUBNET}.2"

die() { echo "netns_pair.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }

check() {
    command -v ip >/dev/null || die "'ip' (iproute2) not found; install iproute2"
    command -v tc >/dev/null || die "'tc' (iproute2) not found; install iproute2"
    [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces need CAP_NET_ADMIN)"
    [[ "$PREFIX" =~ ^[A-Za-z0-9_.-]+$ ]] || die "REVEAL_NETNS_PREFIX='$PREFIX': use letters, digits, . _ -"
    [[ "$SUBNET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] \
        || die "REVEAL_NETNS_SUBNET='$SUBNET': expected three octets, e.g. 10.77.0"
}

ns_exists() { ip netns list | awk -v n="$1" '$1 == n {f = 1} END {exit !f}'; }

# Reachability check A -> B: ping when installed, else a TCP connect with python3.
reachable() {
    if command -v ping >/dev/null; then
        ip netns exec "$NS_A" ping -c1 -W2 "$IP_B" >/dev/null
        return
    fi
    ip netns exec "$NS_B" python3 -c '
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(5)
print(s.getsockname()[1], flush=True); s.accept()' "$IP_B" > "$tmp_port" &
    local pid=$! port="" i
    for i in $(seq 50); do port=$(cat "$tmp_port"); [[ -n "$port" ]] && break; sleep 0.1; done
    [[ -n "$port" ]] && ip netns exec "$NS_A" python3 -c '
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()' "$IP_B" "$port"
    local rc=$?
    wait "$pid" 2>/dev/null || true
    return $rc
}

up() {
    if ns_exists "$NS_A" && ns_exists "$NS_B" \
        && ip -n "$NS_A" link show "$VETH_A" >/dev/null 2>&1; then
        echo "netns pair already up: $NS_A ($IP_A) <-> $NS_B ($IP_B)"
        return 0
    fi
    down quiet   # a half-made pair (e.g. interrupted 'up') is rebuilt from scratch
    ip netns add "$NS_A"
    ip netns add "$NS_B"
    if ! ip link add "$VETH_A" netns "$NS_A" type veth peer name "$VETH_B" netns "$NS_B"; then
        down quiet
        die "could not create veth $VETH_A/$VETH_B (name in use? set REVEAL_NETNS_PREFIX)"
    fi
    ip -n "$NS_A" addr add "$IP_A/24" dev "$VETH_A"
    ip -n "$NS_B" addr add "$IP_B/24" dev "$VETH_B"
    for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
    ip -n "$NS_A" link set "$VETH_A" up
    ip -n "$NS_B" link set "$VETH_B" up
    local i
    for i in $(seq 30); do   # the peer's carrier comes up a moment after 'link set up'
        [[ $(ip netns exec "$NS_B" cat "/sys/class/net/$VETH_B/operstate") == up ]] \
            && [[ $(ip netns exec "$NS_A" cat "/sys/class/net/$VETH_A/operstate") == up ]] && break
        sleep 0.1
    done
    tmp_port=$(mktemp); trap 'rm -f "$tmp_port"' EXIT
    reachable || die "pair created but $IP_A cannot reach $IP_B"
    echo "netns pair up: $NS_A ($IP_A) <-> $NS_B ($IP_B)"
}

down() {
    for ns in "$NS_A" "$NS_B"; do
        if ns_exists "$ns"; then ip netns del "$ns"; fi
    done
    [[ "${1:-}" == quiet ]] || echo "netns pair down: $NS_A $NS_B"
}

require_up() {
    ns_exists "$NS_A" && ns_exists "$NS_B" \
        || die "netns pair $NS_A/$NS_B is not up; run '$0 up' first"
}

slow() {
    local rate="${1:-}"
    [[ -n "$rate" ]] || die "slow needs a RATE, e.g. '$0 slow 10mbit'"
    [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kKmMgG]?(bit|bps))$ ]] \
        || die "RATE '$rate' not understood; use tc units, e.g. 500kbit, 10mbit, 1gbit"
    require_up
    # burst must hold at least one MTU and ~1 ms of traffic at the rate; latency caps the queue.
    local burst="${REVEAL_NETNS_BURST:-32kb}"
    ip netns exec "$NS_A" tc qdisc replace dev "$VETH_A" root tbf rate "$rate" burst "$burst" latency 50ms
    ip netns exec "$NS_B" tc qdisc replace dev "$VETH_B" root tbf rate "$rate" burst "$burst" latency 50ms
    echo "netns pair slowed to $rate each way ($NS_A <-> $NS_B)"
}

restore() {
    require_up
    ip netns exec "$NS_A" tc qdisc del dev "$VETH_A" root 2>/dev/null || true
    ip netns exec "$NS_B" tc qdisc del dev "$VETH_B" root 2>/dev/null || true
    echo "netns pair restored (no rate limit)"
}

status() {
    for ns in "$NS_A" "$NS_B"; do
        if ns_exists "$ns"; then
            echo "== $ns"; ip -n "$ns" -br addr; ip netns exec "$ns" tc qdisc show
        else
            echo "== $ns (absent)"
        fi
    done
}

cmd="${1:-}"
[[ -n "$cmd" ]] || usage
shift
case "$cmd" in
    up) check; up ;;
    down) check; down ;;
    slow) check; slow "$@" ;;
    restore) check; restore ;;
    status) check; status ;;
    exec)
        check
        side="${1:-}"; shift || true
        case "$side" in a) ns="$NS_A" ;; b) ns="$NS_B" ;; *) die "exec needs 'a' or 'b', got '$side'" ;; esac
        [[ $# -gt 0 ]] || die "exec $side needs a command"
        require_up
        exec ip netns exec "$ns" "$@" ;;
    -h|--help|help) usage ;;
    *) echo "netns_pair.sh: unknown command '$cmd'" >&2; usage ;;
esac

#!/usr/bin/env bash
# Two-"node" reveal-torchrun launch on one machine (root): one node per network namespace
# (examples/netns_pair.sh), rendezvous over TCP across the veth, optionally with the link slowed
# (tc tbf) for a while in the middle -- a network anomaly the report should attribute, with the
# iteration-time impact from the markers.
#
#   examples/torchrun_two_nodes.sh [--seconds 45] [--slow RATE] [--slow-at S] [--slow-for S]
#                                  [--out DIR] [--keep] [-- extra train.py args]
#
#   --seconds N    training time per node (default 45)
#   --slow RATE    limit the link to RATE (tc units: 30mbit, 500kbit ...) during the run
#   --slow-at S    seconds after the launch to slow it (default 20; torch start-up takes ~10 s)
#   --slow-for S   how long (default 15)
#   --out DIR      parent of the two run directories (default ./reveal-runs/two-nodes-<time>)
#   --keep         leave the namespaces up afterwards
# Environment: REVEAL_NETNS_PREFIX / REVEAL_NETNS_SUBNET as for netns_pair.sh.
# Exit code: 0 when both nodes' reveal-torchrun exited 0, else the first non-zero one.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NETNS="$HERE/netns_pair.sh"
SECONDS_=45 RATE="" SLOW_AT=20 SLOW_FOR=15 KEEP=0
OUT="reveal-runs/two-nodes-$(date +%Y%m%d-%H%M%S)"
EXTRA=()
die() { echo "torchrun_two_nodes.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) SECONDS_="${2:?--seconds needs a value}"; shift 2 ;;
        --slow) RATE="${2:?--slow needs a RATE}"; shift 2 ;;
        --slow-at) SLOW_AT="${2:?--slow-at needs seconds}"; shift 2 ;;
        --slow-for) SLOW_FOR="${2:?--slow-for needs seconds}"; shift 2 ;;
        --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
for v in "$SECONDS_" "$SLOW_AT" "$SLOW_FOR"; do
    [[ "$v" =~ ^[0-9]+$ ]] || die "'$v' is not a whole number of seconds"
done
command -v reveal-torchrun >/dev/null || die "reveal-torchrun not on PATH (pip install -e .)"

PREFIX="${REVEAL_NETNS_PREFIX:-reveal}"
SUBNET="${REVEAL_NETNS_SUBNET:-10.77.0}"
PORT="${REVEAL_RDZV_PORT:-29400}"
RDZV_ID="two-nodes-$$"
"$NETNS" up
cleanup() { [[ $KEEP == 1 ]] || "$NETNS" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
mkdir -p "$OUT"

node() {  # node SIDE IP IS_HOST
    local side=$1 ip=$2 host=$3
    ip netns exec "${PREFIX}-${side}" env GLOO_SOCKET_IFNAME="${PREFIX:0:10}-v${side}" \
        reveal-torchrun --reveal-out "$OUT" --nnodes 2 --nproc-per-node 1 \
        --rdzv-backend c10d --rdzv-endpoint "${SUBNET}.1:${PORT}" --rdzv-id "$RDZV_ID" \
        --rdzv-conf "is_host=${host}" --local-addr "$ip" \
        "$HERE/train.py" --seconds "$SECONDS_" --instrument "${EXTRA[@]}" \
        > "$OUT/node-${side}.log" 2>&1
}

echo "node a: ${SUBNET}.1 (rendezvous host), node b: ${SUBNET}.2; logs in $OUT/node-{a,b}.log"
node a "${SUBNET}.1" 1 & PID_A=$!
sleep 1
node b "${SUBNET}.2" 0 & PID_B=$!
if [[ -n "$RATE" ]]; then
    (sleep "$SLOW_AT" && "$NETNS" slow "$RATE" && sleep "$SLOW_FOR" && "$NETNS" restore) &
    PID_S=$!
fi
RC_A=0 RC_B=0
wait "$PID_A" || RC_A=$?
wait "$PID_B" || RC_B=$?
[[ -n "$RATE" ]] && { wait "$PID_S" 2>/dev/null || true; }
echo "node a exit $RC_A, node b exit $RC_B; run directories:"
ls -d "$OUT"/*/ 2>/dev/null | sed 's/^/  /'
echo "summary of node a:"
sed -n '/Reveal report/,$p' "$OUT/node-a.log"
[[ $RC_A -ne 0 ]] && exit "$RC_A"
exit "$RC_B"

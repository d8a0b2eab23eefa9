#!/usr/bin/env bash
# Scenario: a slow network between two "hosts" during DDP training.
#
# Two network namespaces joined by a veth pair (examples/netns_pair.sh) stand in for two
# nodes.  One DDP rank runs in each, under `reveal-torchrun` (telemetry + iteration markers on
# both "nodes"; gloo all-reduces gradients over the veth).  SLOW_AT seconds in, the link is
# limited to RATE with tc tbf for SLOW_FOR seconds, then restored.  Reveal should report a
# network anomaly on both nodes (throughput capped, TCP queueing/retransmits) and the
# iteration time going up over that window, with hints about the interconnect.
#
#   sudo examples/slow_network_ddp.sh            # ~90 s; needs root for the namespaces
#   RATE=2mbit SECONDS_TOTAL=90 sudo -E examples/slow_network_ddp.sh
#
# Environment: OUT (job directory; one run directory per node inside), RATE (default 5mbit),
# SECONDS_TOTAL (default 60), SLOW_AT (default 25), SLOW_FOR (default 20), MODEL (default mlp),
# REVEAL_NETNS_PREFIX / REVEAL_NETNS_SUBNET (see netns_pair.sh), PORT (rendezvous, 29455).
# Needs: root, iproute2 (ip, tc), reveal (pip install -e .), torch.
set -euo pipefail
cd "$(dirname "$0")/.."

RATE="${RATE:-5mbit}"
SECONDS_TOTAL="${SECONDS_TOTAL:-60}"
SLOW_AT="${SLOW_AT:-25}"
SLOW_FOR="${SLOW_FOR:-20}"
MODEL="${MODEL:-mlp}"
PORT="${PORT:-29455}"
OUT="${OUT:-reveal-runs/slow-network-ddp-$(date +%Y%m%d-%H%M%S)}"
PREFIX="${REVEAL_NETNS_PREFIX:-reveal}"
SUBNET="${REVEAL_NETNS_SUBNET:-10.77.0}"
PAIR=examples/netns_pair.sh

for c in reveal reveal-torchrun python3 ip tc; do
    command -v "$c" >/dev/null || { echo "slow_network_ddp.sh: '$c' not found (see the header)" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "slow_network_ddp.sh: run as root (network namespaces)" >&2; exit 1; }
if [[ -e "$OUT" ]]; then echo "slow_network_ddp.sh: $OUT exists; set OUT to a new path" >&2; exit 1; fi

"$PAIR" up
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    "$PAIR" down >/dev/null 2>&1 || true
}
trap cleanup EXIT

mkdir -p "$OUT"
# Node a (10.x.x.1) hosts the rendezvous; each node records into $OUT/<host> ($OUT/<host>.2
# for the second, since both namespaces share this machine's hostname).
for side in a b; do
    ip="${SUBNET}.$([[ $side == a ]] && echo 1 || echo 2)"
    # torch decides who hosts the rendezvous store from /etc/hosts, which knows nothing of the
    # namespaces' addresses: say it explicitly.
    is_host=$([[ $side == a ]] && echo 1 || echo 0)
    veth="${PREFIX:0:10}-v${side}"
    GLOO_SOCKET_IFNAME="$veth" PYTHONUNBUFFERED=1 "$PAIR" exec "$side" \
        reveal-torchrun --reveal-out "$OUT" \
        --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "${SUBNET}.1:${PORT}" \
        --rdzv-id "slow-net-$$" --rdzv-conf "is_host=$is_host" --local-addr "$ip" \
        examples/train.py --model "$MODEL" --threads 1 --seconds "$SECONDS_TOTAL" \
        --log-every 0 --instrument > "$OUT/node-$side.log" 2>&1 &
    PIDS+=($!)
    sleep 1
done

# Count SLOW_AT from the first training step (rendezvous and imports take a while), seen as
# the first iteration marker in either node's events.jsonl.
for _ in $(seq 240); do
    grep -qs '"event": "iteration"' "$OUT"/*/events.jsonl && break
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
    sleep 0.5
done
echo "== DDP on 2 namespaces for ${SECONDS_TOTAL}s; link limited to $RATE from +${SLOW_AT}s for ${SLOW_FOR}s"
sleep "$SLOW_AT"
note() {  # a "note" event in every node's run directory: a dotted line in the HTML timelines
    local d
    for d in "$OUT"/*/; do
        [[ -f "$d/meta.json" ]] || continue
        python3 -c 'import sys; from reveal_plugins.store.store import append_event
append_event(sys.argv[1], "note", message=sys.argv[2])' "$d" "$1" 2>/dev/null || true
    done
}
"$PAIR" slow "$RATE"
note "injected: link limited to $RATE"
sleep "$SLOW_FOR"
"$PAIR" restore
note "injected: link restored"

rc=0
for p in "${PIDS[@]}"; do wait "$p" || rc=$?; done
PIDS=()
if [[ $rc -ne 0 ]]; then
    echo "slow_network_ddp.sh: a node failed (exit $rc); logs: $OUT/node-a.log $OUT/node-b.log" >&2
fi
reveal report "$OUT"
reveal report "$OUT" --format html --out "$OUT/report.html" || echo "(HTML report skipped)" >&2
echo "== again: reveal report $OUT   ·   plots: $OUT/report.html   ·   node logs: $OUT/node-*.log"
exit "$rc"

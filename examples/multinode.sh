#!/usr/bin/env bash
# A real multi-node job on one machine (root): N "nodes" (default 2), each with its own network
# namespace and interface (eth0, a veth to a bridge in a switch namespace), its own CPU set
# (taskset; the node's agent counts only those cores), its own host name (UTS namespace, names
# resolvable through a private /etc/hosts), PID namespace, agent and run directory, running
# one gloo DDP job (one rank per node) launched the way users do: reveal-torchrun on every
# node with one c10d rendezvous on node 1.  All run directories land
# under one job directory, <spool>/jobs/<job>/<host>/, so `reveal report` shows one job.
#
#   examples/multinode.sh [--seconds S] [--nodes N] [--spool DIR] [--model mlp|cnn|rnn]
#                         [--width W] [--fault cpu|network|memory|io --node K
#                          [--fault-at S] [--fault-for S] [--rate RATE]]
#
#   --launcher L   torchrun (default): reveal-torchrun started on every node, one c10d
#                  rendezvous; slurm: a private Slurm (slurmctld in the switch namespace, one
#                  slurmd per node namespace, munge, Reveal's Prolog/Epilog, each node's agent
#                  started by its Prolog) and `srun -N <nodes> reveal-torchrun ...`
#   --seconds S    training time (default 60)
#   --nodes N      number of nodes (default 2; at most one per online CPU)
#   --model, --width  examples/train.py's model (default mlp, width 512: compute and
#                  all-reduce both matter, ~10-20 ms a step on one core)
#   --spool DIR    shared spool (default ./reveal-runs/multinode): the job directory is
#                  DIR/jobs/<job>/, the job report DIR/reports/job-<job>.json
#   --fault KIND   inject a fault on node K (default: nothing is injected), --fault-at seconds
#                  after `ready` (default 5) for --fault-for seconds (default 20):
#                    cpu      a CPU hog pinned to the node's CPU set (stress-ng --cpu)
#                    network  tc tbf on the node's interface (--rate, default 20mbit)
#                    memory   memory bandwidth / page faults on the node's CPUs (stress-ng --vm)
#                    io       buffered disk writes from the node's CPUs (stress-ng --hdd;
#                             the disk itself is shared by all nodes of this machine)
#
# Standard output, exactly:
#   node=<host> netns=<namespace> dev=<interface inside it> cpus=<cpu list>   (one per node)
#   ready                                    (once every node trains in steady state)
#   report=<path of the job report JSON>     (last line, after the job ended)
# Everything else (the fault's times, what went wrong) goes to standard error; node logs to
# DIR/logs/<job>/.  Inject your own fault after `ready` using the node line, e.g.
#   taskset -c <cpus> stress-ng --cpu 1 --timeout 20
#   ip netns exec <namespace> tc qdisc add dev <dev> root tbf rate 20mbit burst 32kb latency 50ms
# Nothing is left behind on any exit (namespaces, processes, qdiscs): a trap tears it down.
# Exit code: 0 when the job succeeded on every node, else the first non-zero code.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LAUNCHER=torchrun SECS=60 NODES=2 SPOOL="reveal-runs/multinode" MODEL=mlp WIDTH=512
FAULT="" FNODE="" FAULT_AT=5 FAULT_FOR=20 RATE=20mbit
die() { echo "multinode.sh: $*" >&2; exit 2; }
say() { echo "multinode.sh: $*" >&2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --launcher) LAUNCHER="${2:?--launcher needs torchrun or slurm}"; shift 2 ;;
        --seconds) SECS="${2:?--seconds needs a value}"; shift 2 ;;
        --nodes) NODES="${2:?--nodes needs a value}"; shift 2 ;;
        --spool) SPOOL="${2:?--spool needs a directory}"; shift 2 ;;
        --model) MODEL="${2:?--model needs mlp, cnn or rnn}"; shift 2 ;;
        --width) WIDTH="${2:?--width needs a value}"; shift 2 ;;
        --fault) FAULT="${2:?--fault needs cpu, network, memory or io}"; shift 2 ;;
        --node) FNODE="${2:?--node needs a node number}"; shift 2 ;;
        --fault-at) FAULT_AT="${2:?--fault-at needs seconds}"; shift 2 ;;
        --fault-for) FAULT_FOR="${2:?--fault-for needs seconds}"; shift 2 ;;
        --rate) RATE="${2:?--rate needs a tc rate}"; shift 2 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
for v in "$SECS" "$NODES" "$FAULT_AT" "$FAULT_FOR"; do
    [[ "$v" =~ ^[0-9]+$ ]] || die "'$v' is not a whole number"
done
[[ "$WIDTH" =~ ^[0-9]+$ ]] || die "--width '$WIDTH' is not a whole number"
[[ "$LAUNCHER" == torchrun || "$LAUNCHER" == slurm ]] \
    || die "--launcher '$LAUNCHER': expected torchrun or slurm"
[[ $NODES -ge 2 ]] || die "--nodes $NODES: a multi-node job needs at least 2"
case "$FAULT" in
    "") [[ -z "$FNODE" ]] || die "--node $FNODE without --fault" ;;
    cpu|network|memory|io)
        [[ "$FNODE" =~ ^[0-9]+$ && $FNODE -ge 1 && $FNODE -le $NODES ]] \
            || die "--fault $FAULT needs --node K with 1 <= K <= $NODES (got '${FNODE}')" ;;
    *) die "--fault '$FAULT': expected cpu, network, memory or io" ;;
esac
[[ "$RATE" =~ ^[0-9]+(\.[0-9]+)?[kKmMgG]?(bit|bps)$ ]] \
    || die "--rate '$RATE': use tc units, e.g. 20mbit"
[[ $(id -u) -eq 0 ]] || die "must run as root (network, UTS and PID namespaces)"
for c in ip tc unshare taskset hostname reveal-torchrun reveal python3; do
    command -v "$c" >/dev/null || die "'$c' not found on PATH"
done
if [[ $LAUNCHER == slurm ]]; then
    for c in slurmctld slurmd srun sinfo munged runuser nsenter; do
        command -v "$c" >/dev/null || die "--launcher slurm: '$c' not found (apt-get install \
slurmctld slurmd slurm-client munge)"
    done
fi
[[ -z "$FAULT" || "$FAULT" == network ]] || command -v stress-ng >/dev/null \
    || die "--fault $FAULT needs stress-ng"

# CPU sets: the online CPUs cut into NODES contiguous shares.
mapfile -t CPUS_ALL < <(python3 -c '
from reveal_plugins.probes.cpuset import online_cpus
print(*online_cpus(), sep="\n")')
NCPU=${#CPUS_ALL[@]}
[[ $NODES -le $NCPU ]] || die "--nodes $NODES: only $NCPU online CPU(s), one node needs one"
PER=$((NCPU / NODES))

P="rmn$$"                       # namespace prefix, unique to this run
SW="${P}-sw"
SUBNET="10.79.0"                # inside private namespaces: never collides with the host
if [[ $LAUNCHER == slurm ]]; then   # Slurm numbers the job: a fresh controller's first id
    JOB=$(( $(date +%s) % 60000000 + 1000 ))
else
    JOB="$(date +%s%3N)"
fi
mkdir -p "$SPOOL/jobs" "$SPOOL/reports" "$SPOOL/logs/$JOB"
SPOOL="$(cd "$SPOOL" && pwd)"
JOBDIR="$SPOOL/jobs/$JOB"
LOGS="$SPOOL/logs/$JOB"
WORK="$(mktemp -d "/tmp/reveal-multinode.$P.XXXXXX")"   # named by the prefix: findable
declare -a NODE_PIDS=() DAEMON_PIDS=() NS=() CPUS=()
FAULT_PID=""

cleanup() {
    local rc=$? pid ns
    trap - EXIT INT TERM
    [[ -n "$FAULT_PID" ]] && kill -- -"$FAULT_PID" 2>/dev/null || true
    for pid in "${NODE_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${NODE_PIDS[@]}" $FAULT_PID; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    # Slurm: the node PID namespaces (slurmd, slurmstepd, agents), slurmctld, munged
    [[ -f "$WORK/munge-run/munged.pid" ]] && DAEMON_PIDS+=("$(cat "$WORK/munge-run/munged.pid")")
    for pid in "${DAEMON_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${DAEMON_PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    for ns in "${NS[@]}" "$SW"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    if mountpoint -q "$WORK/hostproc" 2>/dev/null; then umount -l "$WORK/hostproc" || true; fi
    rm -rf --one-file-system "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP     # the terminal went away
trap 'exit 141' PIPE    # whoever read our output stopped (| head): still tear everything down

# The machine's /proc, for the agents in the nodes' PID namespaces: a process somebody pins to
# a node's CPUs from outside (a noisy neighbour) is that node's (probes/nodeprocs.py).
mkdir -p "$WORK/hostproc"
mount --bind /proc "$WORK/hostproc"

# The network: a bridge in a switch namespace, one veth per node (eth0 inside the node).
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
ip -n "$SW" link set lo up
for k in $(seq "$NODES"); do
    ns="${P}-n$k"
    NS+=("$ns")
    ip netns add "$ns"
    ip link add eth0 netns "$ns" type veth peer name "n$k" netns "$SW"
    ip -n "$SW" link set "n$k" master br0 up
    ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    CPUS+=("$(python3 -c 'import sys
from reveal_plugins.probes.cpuset import format_cpulist
print(format_cpulist([int(c) for c in sys.argv[1:]]))' "${CPUS_ALL[@]:$(((k - 1) * PER)):$PER}")")
done
reach() {  # reach K: node 1 can open a TCP connection to node K
    ip netns exec "${NS[$(($1 - 1))]}" python3 -c '
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(3)
print(s.getsockname()[1], flush=True); s.accept()' "$SUBNET.$1" > "$WORK/port" &
    local pid=$! port=""
    for _ in $(seq 50); do port=$(cat "$WORK/port"); [[ -n "$port" ]] && break; sleep 0.05; done
    ip netns exec "${NS[0]}" python3 -c '
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()' \
        "$SUBNET.$1" "$port" 2>/dev/null
    local rc=$?
    wait "$pid" 2>/dev/null || true
    return $rc
}
for k in $(seq 2 "$NODES"); do
    ok=0
    for _ in $(seq 30); do reach "$k" && { ok=1; break; }; sleep 0.1; done
    [[ $ok == 1 ]] || die "node 1 cannot reach node $k over the bridge"
done

# One job: reveal-torchrun on every node, in the node's namespaces and CPU set.  A PID
# namespace per node means that when its launcher ends, nothing it started outlives it.
TRAIN=("$HERE/train.py" --model "$MODEL" --width "$WIDTH" --seconds "$SECS" --instrument
       --threads "$PER" --log-every 0)
{ echo "127.0.0.1 localhost"
  echo "$SUBNET.254 head"
  for k in $(seq "$NODES"); do echo "$SUBNET.$k node$k"; done; } > "$WORK/hosts"
for k in $(seq "$NODES"); do
    echo "node=node$k netns=${NS[$((k - 1))]} dev=eth0 cpus=${CPUS[$((k - 1))]}"
done
if [[ $LAUNCHER == slurm ]]; then
    # shellcheck source=examples/multinode_slurm.sh
    source "$HERE/multinode_slurm.sh"
    slurm_up
    slurm_job
fi
for k in $(seq "$NODES"); do
    [[ $LAUNCHER == torchrun ]] || break
    host="node$k"
    mkdir -p "$WORK/$host"
    ip netns exec "${NS[$((k - 1))]}" taskset -c "${CPUS[$((k - 1))]}" \
        unshare --uts --pid --fork --mount-proc --kill-child \
        env TMPDIR="$WORK/$host" REVEAL_CPUS="${CPUS[$((k - 1))]}" REVEAL_LIVE=1 \
            REVEAL_HOST_PROC="$WORK/hostproc" \
            GLOO_SOCKET_IFNAME=eth0 \
        sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && "$@"' \
            sh "$host" "$WORK/hosts" \
        reveal-torchrun --reveal-out "$JOBDIR" --nnodes "$NODES" --nproc-per-node 1 \
            --rdzv-backend c10d --rdzv-endpoint "$SUBNET.1:29400" --rdzv-id "job-$JOB" \
            --rdzv-conf "is_host=$([[ $k == 1 ]] && echo 1 || echo 0)" --local-addr "$SUBNET.$k" \
            "${TRAIN[@]}" > "$LOGS/$host.log" 2>&1 &
    NODE_PIDS+=($!)
done

# Steady state: every node's ranks have iterated for a while (iteration markers).
STEADY_S="${REVEAL_MULTINODE_STEADY_S:-8}"
steady() {
    python3 - "$JOBDIR" "$NODES" "$STEADY_S" <<'EOF'
import json, os, sys, time
job, n, need = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
firsts = []
for h in sorted(os.listdir(job)) if os.path.isdir(job) else []:
    ts = []
    try:
        with open(os.path.join(job, h, "events.jsonl")) as f:
            for line in f:
                if '"iteration"' in line:
                    ts.append(json.loads(line)["t"])
    except (OSError, ValueError):
        continue
    if ts:
        firsts.append(min(ts))
sys.exit(0 if len(firsts) >= n and time.time() - max(firsts) >= need else 1)
EOF
}
alive() { local p; for p in "${NODE_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done; }
until steady; do
    alive || { say "a node ended before training reached steady state; logs in $LOGS"; break; }
    sleep 0.5
done
alive && echo ready

inject() {  # runs in the background, in its own process group; ends by itself
    local k=$FNODE ns="${NS[$((FNODE - 1))]}" cpus="${CPUS[$((FNODE - 1))]}"
    sleep "$FAULT_AT"
    local t0 t1
    t0=$(date +%s.%N)
    case "$FAULT" in
        cpu) taskset -c "$cpus" stress-ng --cpu "$PER" --timeout "${FAULT_FOR}s" -q ;;
        memory) taskset -c "$cpus" stress-ng --vm "$PER" --vm-bytes 1G --vm-keep \
                    --timeout "${FAULT_FOR}s" -q ;;
        io) taskset -c "$cpus" stress-ng --hdd "$PER" --hdd-bytes 512M \
                --temp-path "$WORK" --timeout "${FAULT_FOR}s" -q ;;
        network)
            ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$RATE" burst 32kb \
                latency 50ms
            sleep "$FAULT_FOR"
            ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true ;;
    esac
    t1=$(date +%s.%N)
    say "fault $FAULT node=node$k start=$t0 end=$t1"
}
if [[ -n "$FAULT" ]] && alive; then
    set -m
    inject & FAULT_PID=$!
    set +m
fi

RC=0
for pid in "${NODE_PIDS[@]}"; do
    r=0; wait "$pid" || r=$?
    [[ $RC -ne 0 ]] || RC=$r
done
if [[ -n "$FAULT_PID" ]]; then
    kill -- -"$FAULT_PID" 2>/dev/null || true
    wait "$FAULT_PID" 2>/dev/null || true
    FAULT_PID=""
fi
NODE_PIDS=()
[[ $RC -eq 0 ]] || say "the job failed (exit $RC); logs in $LOGS"

[[ $LAUNCHER == slurm ]] && slurm_wait_reports
REPORT="$SPOOL/reports/job-$JOB.json"
if reveal report "$JOBDIR" --format json > "$REPORT.tmp" 2> "$LOGS/report.err"; then
    mv "$REPORT.tmp" "$REPORT"
else
    rm -f "$REPORT.tmp"
    say "reveal report $JOBDIR failed: $(tail -n 3 "$LOGS/report.err")"
    [[ $RC -ne 0 ]] || RC=1
fi
[[ -f "$REPORT" ]] && echo "report=$REPORT"
exit "$RC"

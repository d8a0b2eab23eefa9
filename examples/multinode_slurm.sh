# Sourced by examples/multinode.sh --launcher slurm: a private Slurm on the example's nodes.
#
# munged (own key copy and socket), slurmctld in the switch namespace (host "head",
# $SUBNET.254 on the bridge), one slurmd per node namespace (-N nodeK, NodeAddr its eth0
# address: every slurmd listens on the same port, each in its own network namespace), each in
# the node's CPU set, UTS, mount and PID namespace.  Reveal's Prolog/Epilog run in slurmd's
# namespaces, so each node's agent (started by its Prolog) counts that node's CPUs
# (REVEAL_CPUS from the hook's own affinity) and interfaces.  Spool: inside node K,
# $WORK/spool is node K's own (agent socket, pending queue) and $WORK/spool/jobs is the shared
# $SPOOL/jobs (bind mounts: the layout docs/slurm.md recommends for a shared spool).
# All daemons' PIDs go to DAEMON_PIDS, which multinode.sh's trap stops.

slurm_up() {
    local conf="$WORK/etc/slurm.conf" k
    mkdir -p "$WORK"/{etc,state,log,munge,munge-run,spool/jobs,hooks}
    chmod 755 "$WORK"
    SLURM_CONF_FILE="$conf"
    if [[ -r /etc/munge/munge.key ]]; then cp /etc/munge/munge.key "$WORK/munge/munge.key"
    else head -c 1024 /dev/urandom > "$WORK/munge/munge.key"; fi
    chown -R munge:munge "$WORK/munge" "$WORK/munge-run"
    chmod 700 "$WORK/munge"; chmod 600 "$WORK/munge/munge.key"
    runuser -u munge -- munged --socket="$WORK/munge-run/munge.socket" \
        --key-file="$WORK/munge/munge.key" --pid-file="$WORK/munge-run/munged.pid" \
        --log-file="$WORK/munge/munged.log" --seed-file="$WORK/munge/munged.seed" \
        || die "munged did not start"
    # Reveal's hooks: the node's CPU set from the hook's own affinity (slurmd's), live on
    printf 'spool = "%s"\n' "$WORK/spool" > "$WORK/etc/reveal-slurm.conf"
    python3 - "$WORK/hooks" "$WORK/etc/reveal-slurm.conf" "$LOGS/hooks.log" "$WORK/hostproc" <<'PY'
import os, sys
from reveal_plugins.slurm.install import script
d, cfg, log, hostproc = sys.argv[1:5]
for hook in ("prolog", "epilog"):
    body = script(hook, {"REVEAL_SLURM_CONFIG": cfg, "REVEAL_SLURM_LOG": log,
                         "REVEAL_LIVE": "1", "REVEAL_HOST_PROC": hostproc,
                         "PYTHONPATH": os.path.dirname(os.path.dirname(
                             os.path.abspath(sys.modules["reveal_plugins"].__file__)))})
    body = body.replace("#!/bin/sh\n", "#!/bin/sh\nexport REVEAL_CPUS=\"$(taskset -pc $$ | "
                        "sed 's/.*: //')\"\n", 1)
    with open(os.path.join(d, hook), "w") as f:
        f.write(body)
    os.chmod(os.path.join(d, hook), 0o755)
PY
    {
        cat <<EOC
ClusterName=multinode
SlurmctldHost=head($SUBNET.254)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$WORK/munge-run/munge.socket
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/slurmd-%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
FirstJobId=$JOB
PrologFlags=Alloc
Prolog=$WORK/hooks/prolog
Epilog=$WORK/hooks/epilog
PrologEpilogTimeout=30
SlurmdParameters=config_overrides
EOC
        for k in $(seq "$NODES"); do
            echo "NodeName=node$k NodeAddr=$SUBNET.$k CPUs=$PER State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
    } > "$conf"
    ip -n "$SW" addr add "$SUBNET.254/24" dev br0
    ip netns exec "$SW" unshare --uts --mount sh -c \
        'hostname head && mount --bind "$1" /etc/hosts && exec slurmctld -D -c -f "$2"' \
        sh "$WORK/hosts" "$conf" > "$LOGS/slurmctld.out" 2>&1 &
    DAEMON_PIDS+=($!)
    disown $!   # stopped by the trap; no "Killed" job notices
    for k in $(seq "$NODES"); do
        mkdir -p "$WORK/node$k-spool/jobs"
        # nsenter, not `ip netns exec`: slurmd needs the host's /sys/fs/cgroup
        nsenter --net="/run/netns/${NS[$((k - 1))]}" taskset -c "${CPUS[$((k - 1))]}" \
            unshare --uts --mount --pid --fork --mount-proc --kill-child sh -c '
                hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" "$4" &&
                mount --bind "$5" "$4/jobs" && exec slurmd -D -f "$6" -N "$1"' \
            sh "node$k" "$WORK/hosts" "$WORK/node$k-spool" "$WORK/spool" "$SPOOL/jobs" "$conf" \
            > "$LOGS/slurmd-node$k.out" 2>&1 &
        DAEMON_PIDS+=($!)
        disown $!
    done
    local i idle
    for i in $(seq 120); do
        idle=$(ip netns exec "$SW" env SLURM_CONF="$conf" sinfo -h -N -o '%T' 2>/dev/null \
               | grep -c '^idle' || true)
        [[ $idle == "$NODES" ]] && return 0
        sleep 0.5
    done
    die "the Slurm nodes did not come up idle; see $LOGS/slurm*.log"
}

slurm_job() {  # srun from the head node: one reveal-torchrun per node, as a user would
    ip netns exec "$SW" unshare --uts --mount sh -c \
        'hostname head && mount --bind "$1" /etc/hosts && shift && exec "$@"' sh "$WORK/hosts" \
        env SLURM_CONF="$SLURM_CONF_FILE" REVEAL_SPOOL="$WORK/spool" GLOO_SOCKET_IFNAME=eth0 \
        srun -N "$NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 -o "$LOGS/%N.log" \
        sh -c 'n=$1; net=$2; shift 2
               k=$((SLURM_NODEID + 1)); host=0; [ "$k" = 1 ] && host=1
               exec reveal-torchrun --nnodes "$n" --nproc-per-node 1 --rdzv-backend c10d \
                   --rdzv-endpoint "$net.1:29400" --rdzv-id "slurm-$SLURM_JOB_ID" \
                   --rdzv-conf "is_host=$host" --local-addr "$net.$k" "$@"' \
            sh "$NODES" "$SUBNET" "${TRAIN[@]}" > "$LOGS/srun.log" 2>&1 &
    NODE_PIDS+=($!)
}

slurm_wait_reports() {  # the Epilog analyses each node's run detached: wait (bounded) for it
    local i k n
    for i in $(seq 240); do
        n=0
        for k in $(seq "$NODES"); do [[ -f "$JOBDIR/node$k/report.json" ]] && n=$((n + 1)); done
        [[ $n == "$NODES" ]] && return 0
        sleep 0.5
    done
    say "not every node's Epilog analysis finished within 120 s; reveal report analyses the rest"
}

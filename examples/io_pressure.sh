#!/usr/bin/env bash
# Scenario: storage (or memory) pressure during training.
#
# A real CPU training run (examples/train.py) is recorded with `reveal record`; STRESS_AT
# seconds in, stress-ng starts writing to disk (MODE=io, the default: --hdd writers with
# fsync'd files) or allocating and touching memory (MODE=memory: --vm workers) outside the
# recorded job for STRESS_FOR seconds.  Reveal should report a storage anomaly (I/O pressure,
# write throughput, time the disk was busy, tasks blocked on I/O) or a memory one (memory
# pressure, page faults, reclaim) over that window, with hints.
#
#   examples/io_pressure.sh                      # ~75 s; writes ~1 GB under the run directory
#   MODE=memory VM_BYTES=60% examples/io_pressure.sh
#
# Environment: OUT (run directory), MODE (io|memory), SECONDS_TOTAL (default 60), STRESS_AT
# (default 25), STRESS_FOR (default 20), HDD_BYTES (per writer, default 512M), VM_BYTES (memory
# mode, share of available memory across workers, default 60%: the kernel then reclaims pages;
# keep it below ~80% on a shared machine), MODEL (default mlp), THREADS (default 1).
# Needs: reveal (pip install -e .), torch, stress-ng (apt-get install -y stress-ng).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${MODE:-io}"
SECONDS_TOTAL="${SECONDS_TOTAL:-60}"
STRESS_AT="${STRESS_AT:-25}"
STRESS_FOR="${STRESS_FOR:-20}"
MODEL="${MODEL:-mlp}"
THREADS="${THREADS:-1}"
OUT="${OUT:-reveal-runs/${MODE}-pressure-$(date +%Y%m%d-%H%M%S)}"

for c in reveal stress-ng python3; do
    command -v "$c" >/dev/null || { echo "io_pressure.sh: '$c' not found (see the header)" >&2; exit 1; }
done
if [[ -e "$OUT" ]]; then echo "io_pressure.sh: $OUT exists; set OUT to a new path" >&2; exit 1; fi
case "$MODE" in
    io)     SCRATCH="$(mktemp -d "${TMPDIR:-/var/tmp}/reveal-io.XXXXXX")"
            STRESS=(stress-ng --hdd 2 --hdd-bytes "${HDD_BYTES:-512M}" --hdd-opts fsync
                    --temp-path "$SCRATCH" --timeout "${STRESS_FOR}s" --quiet) ;;
    memory) SCRATCH=""
            STRESS=(stress-ng --vm 1 --vm-bytes "${VM_BYTES:-60%}" --vm-keep --page-in
                    --timeout "${STRESS_FOR}s" --quiet) ;;
    *) echo "io_pressure.sh: MODE must be io or memory, got '$MODE'" >&2; exit 2 ;;
esac

# Marks the run's events.jsonl (a "note" event): the HTML timelines show it as a dotted line.
note() {
    python3 -c 'import sys; from reveal_plugins.store.store import append_event
append_event(sys.argv[1], "note", message=sys.argv[2])' "$OUT" "$1" 2>/dev/null || true
}

# The pressure starts STRESS_AT seconds after the first training step, outside the job.
NOISE_PID="$(mktemp)"
noise() {
    ( sleep "$STRESS_AT"
      note "injected: ${STRESS[*]:0:3} for ${STRESS_FOR}s"
      "${STRESS[@]}"
      note "injected: stress-ng stopped" ) &
    echo $! > "$NOISE_PID"
}
cleanup() {
    local p; p="$(cat "$NOISE_PID" 2>/dev/null)"
    [[ -n "$p" ]] && { pkill -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; } || true
    rm -f "$NOISE_PID"
    [[ -n "$SCRATCH" ]] && rm -rf "$SCRATCH"
    return 0
}
trap cleanup EXIT

echo "== recording ${SECONDS_TOTAL}s of training; ${STRESS[*]:0:3} from +${STRESS_AT}s (after the first step) for ${STRESS_FOR}s"
set +e
PYTHONUNBUFFERED=1 reveal record --out "$OUT" -- python3 examples/train.py --model "$MODEL" \
    --threads "$THREADS" --seconds "$SECONDS_TOTAL" --log-every 0 |
    while IFS= read -r line; do
        printf '%s\n' "$line"
        if [[ -z "${started:-}" && "$line" == "train.py: model="* ]]; then started=1; noise; fi
    done
rc=${PIPESTATUS[0]}
set -e
reveal report "$OUT" --format html --out "$OUT/report.html" || echo "(HTML report skipped)" >&2
echo "== text summary again: reveal report $OUT   ·   plots: $OUT/report.html"
exit "$rc"

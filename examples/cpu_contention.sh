#!/usr/bin/env bash
# Scenario: CPU contention during training (a "noisy neighbour").
#
# A real CPU training run (examples/train.py) is recorded with `reveal record`; STRESS_AT
# seconds in, stress-ng starts HOGS CPU hogs (default: two per core) *outside* the recorded
# job for STRESS_FOR seconds.  Reveal should report a CPU anomaly over that window (run queue,
# CPU pressure, context switches up) with hints to find the competing processes and to
# isolate the job's cores.
#
#   examples/cpu_contention.sh                   # ~75 s; run directory under reveal-runs/
#   OUT=/tmp/cpu SECONDS_TOTAL=90 examples/cpu_contention.sh
#
# Environment: OUT (run directory), SECONDS_TOTAL (training length, default 60), STRESS_AT
# (default 25), STRESS_FOR (default 20), HOGS (stress-ng --cpu workers), MODEL (mlp|cnn|rnn,
# default cnn), THREADS (torch threads, default 1: leaves the other cores idle so the hogs'
# arrival stands out).
# Needs: reveal (pip install -e .), torch, stress-ng (apt-get install -y stress-ng).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_TOTAL="${SECONDS_TOTAL:-60}"
STRESS_AT="${STRESS_AT:-25}"
STRESS_FOR="${STRESS_FOR:-20}"
MODEL="${MODEL:-cnn}"
THREADS="${THREADS:-1}"
HOGS="${HOGS:-$(( 2 * $(nproc) ))}"
OUT="${OUT:-reveal-runs/cpu-contention-$(date +%Y%m%d-%H%M%S)}"

for c in reveal stress-ng python3; do
    command -v "$c" >/dev/null || { echo "cpu_contention.sh: '$c' not found (see the header)" >&2; exit 1; }
done
if [[ -e "$OUT" ]]; then echo "cpu_contention.sh: $OUT exists; set OUT to a new path" >&2; exit 1; fi

# Marks the run's events.jsonl (a "note" event): the HTML timelines show it as a dotted line.
note() {
    python3 -c 'import sys; from reveal_plugins.store.store import append_event
append_event(sys.argv[1], "note", message=sys.argv[2])' "$OUT" "$1" 2>/dev/null || true
}

# The noisy neighbour: not part of the recorded command, as on a shared node.  It starts
# STRESS_AT seconds after the first training step (torch's import time varies a lot).
NOISE_PID="$(mktemp)"
noise() {
    ( sleep "$STRESS_AT"
      note "injected: stress-ng --cpu $HOGS for ${STRESS_FOR}s"
      stress-ng --cpu "$HOGS" --timeout "${STRESS_FOR}s" --quiet
      note "injected: stress-ng stopped" ) &
    echo $! > "$NOISE_PID"
}
cleanup() {
    local p; p="$(cat "$NOISE_PID" 2>/dev/null)"
    [[ -n "$p" ]] && { pkill -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; } || true
    rm -f "$NOISE_PID"
}
trap cleanup EXIT

echo "== recording ${SECONDS_TOTAL}s of training; stress-ng --cpu $HOGS from +${STRESS_AT}s (after the first step) for ${STRESS_FOR}s"
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

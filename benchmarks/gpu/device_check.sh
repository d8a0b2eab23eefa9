#!/usr/bin/env bash
# GPU device check: what the driver answers, what reading it costs, and a recorded bf16
# training run with three injected machine problems.  Runs from the project root with
# PYTHONPATH=. and nothing installed (nvidia-ml-py, torch, numpy, pyarrow, scikit-learn, pluggy
# present; pydantic from ./.whl when there).  Read-only towards the GPU: never changes clocks,
# power limits, persistence, MIG or any other setting.  About 4 minutes.
#
#   bash benchmarks/gpu/device_check.sh OUTDIR
#
# OUTDIR/check.tar.gz holds: survey.json (channels answered/refused, per-call latency),
# timing.json (probe vs plain per-field loop vs nvidia-smi), probes.json, smi.txt,
# trace.jsonl (raw NVML at 10 Hz during training), steps.jsonl (the job's own step times),
# injections.json (ground truth), train.log, report.txt and the run directory run/.
set -u
OUTDIR=${1:?usage: device_check.sh OUTDIR}
W=$(mktemp -d /tmp/reveal-gpu-check.XXXX)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
step() { printf '\n== %s (%s)\n' "$*" "$(date +%T)"; }

step "driver"
nvidia-smi -L
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,PIDS > "$W/smi.txt" 2>&1
$PY -c 'import pynvml,torch,sys; print("python", sys.version.split()[0], "torch", torch.__version__, "nvidia-ml-py", getattr(pynvml,"__version__","?"))'

step "survey"
timeout 120 $PY benchmarks/gpu/nvml_survey.py --out "$W/survey.json" --reps 20 2>&1 | head -120

step "timing"
timeout 120 $PY benchmarks/gpu/probe_timing.py --out "$W/timing.json" --samples 300

step "reveal probes"
timeout 60 $PY -m reveal_plugins.cli probes --json > "$W/probes.json" 2> "$W/probes.err"
$PY - "$W/probes.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    for p in (d if isinstance(d, list) else d.get("probes", [])):
        print(p.get("name"), p.get("available"), len(p.get("channels", [])) if isinstance(p.get("channels"), list) else p.get("channels"), (p.get("reason") or p.get("note") or "")[:150])
except Exception as e:
    print("probes.json unreadable:", e)
PY

step "training 90 s under reveal-torchrun, with injections"
$PY benchmarks/gpu/nvml_trace.py --out "$W/trace.jsonl" --seconds 200 --stop-file "$W/stop" \
    > "$W/trace.log" 2>&1 &
TRACE=$!
timeout 240 $PY -m reveal_plugins.torch_ext.launcher --reveal-out "$W/run" --standalone \
    --nproc-per-node 1 benchmarks/gpu/train_gpu.py --seconds 90 --log "$W/steps.jsonl" \
    > "$W/train.log" 2>&1 &
TRAIN=$!
for _ in $(seq 600); do [ -s "$W/steps.jsonl" ] && break; kill -0 $TRAIN 2>/dev/null || break; sleep 0.1; done
T0=$(date +%s.%N); echo "first step at $T0"
inject() {  # at-seconds duration kind
  sleep "$(python3 -c "import time; print(max(0, $T0 + $1 - time.time()))")"
  local a b; a=$(date +%s.%N)
  timeout $(( $2 + 30 )) $PY benchmarks/gpu/inject_gpu.py "$3" --seconds "$2" >> "$W/inject.log" 2>&1
  b=$(date +%s.%N)
  echo "{\"kind\": \"$3\", \"start\": $a, \"end\": $b}" >> "$W/injections.jsonl"
}
( inject 15 12 matmul; inject 40 12 h2d; inject 65 12 cpuhog ) &
INJ=$!
wait $TRAIN; echo "training exit $?"
wait $INJ
touch "$W/stop"; wait $TRACE
tail -25 "$W/train.log"
cat "$W/injections.jsonl" "$W/inject.log"
$PY - "$W/steps.jsonl" "$W/injections.jsonl" <<'PY'
import json, sys, statistics
steps = [json.loads(l) for l in open(sys.argv[1])]
inj = [json.loads(l) for l in open(sys.argv[2])]
def med(sel):
    v = [s["step_s"] for s in steps if sel(s["t"])]
    return (round(statistics.median(v) * 1e3, 1), len(v)) if v else None
clean = lambda t: all(not (i["start"] - 2 <= t <= i["end"] + 2) for i in inj)
print("step ms (median, n) clean:", med(clean))
for i in inj:
    print(f"step ms during {i['kind']}:", med(lambda t, i=i: i["start"] + 1 <= t <= i["end"]))
PY

step "report"
timeout 120 $PY -m reveal_plugins.cli report "$W/run" > "$W/report.txt" 2>&1
head -80 "$W/report.txt"

mkdir -p "$OUTDIR"
tar -C "$W" -czf "$OUTDIR/check.tar.gz" .
ls -la "$OUTDIR"

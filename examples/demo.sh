#!/usr/bin/env bash
# The README's demo: install what is needed, record a real training run while a noisy
# neighbour (stress-ng) competes for the CPU, and print Reveal's summary.  A few minutes on a
# laptop or a fresh Debian 12 machine (run as root, or with sudo for the apt step).
#
#   examples/demo.sh
#
# What it does:
#   1. apt-get install stress-ng (and python3-venv/pip where needed, see .ci/venv.sh), unless
#      already present;
#   2. pip install -e '.[html]' (into .venv when the system Python is "externally managed", as on
#      Debian 12; torch comes from the CPU-only wheel index when it is not installed yet);
#   3. examples/cpu_contention.sh: 60 s of examples/train.py under `reveal record`, with
#      stress-ng hogging every core from +25 s for 20 s; prints the text summary and writes
#      an HTML report next to the run.
# Environment: DEMO_SKIP_INSTALL=1 skips steps 1-2; everything cpu_contention.sh reads (OUT,
# SECONDS_TOTAL, STRESS_AT, STRESS_FOR, MODEL, THREADS) passes through.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
sudo_() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

install() {
    local need_apt=()
    command -v stress-ng >/dev/null || need_apt+=(stress-ng)
    command -v python3 >/dev/null || need_apt+=(python3)
    local managed
    managed=$(python3 - <<'PY' 2>/dev/null || echo 0
import os, sys, sysconfig
print(int(os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
          and sys.prefix == sys.base_prefix))
PY
)
    if [[ "$managed" != 1 ]]; then
        python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
    fi
    if ((${#need_apt[@]})); then
        say "apt-get install ${need_apt[*]}"
        sudo_ apt-get update -qq
        sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${need_apt[@]}" >/dev/null
    fi
    if [[ "$managed" == 1 ]]; then
        # Debian 12's Python refuses system-wide pip installs (PEP 668): use a venv that still
        # sees system packages (numpy, torch) when they are installed.  .ci/venv.sh makes it
        # (the same as the test command's; it installs python3-venv when needed).
        say "venv .venv (--system-site-packages)"
        # shellcheck source=../.ci/venv.sh
        . "$ROOT/.ci/venv.sh"
        reveal_venv python3 .venv --system-site-packages
        export PATH="$ROOT/.venv/bin:$PATH"
    fi
    say "pip install -e '.[html]'  (reveal, its dependencies, matplotlib for the HTML report)"
    python3 -m pip install -q -e '.[html]' 2>&1 | grep -v "^\s*$" | tail -5 || true
    if ! python3 -c 'import torch' 2>/dev/null; then
        say "pip install torch (CPU-only build, ~200 MB)"
        # torch==2.13.0 is the CPU build where a local wheel cache provides it; elsewhere fall
        # back to PyTorch's CPU-only index (a bare "torch" from PyPI pulls GBs of CUDA).
        python3 -m pip install -q torch==2.13.0 2>/dev/null \
            || python3 -m pip install -q --retries 1 torch --index-url https://download.pytorch.org/whl/cpu
    fi
    command -v reveal >/dev/null || { echo "demo.sh: 'reveal' not on PATH after install" >&2; exit 1; }
}

if [[ "${DEMO_SKIP_INSTALL:-0}" != 1 ]]; then
    install
elif [[ -x .venv/bin/reveal ]]; then
    export PATH="$ROOT/.venv/bin:$PATH"
fi

say "recording a training run with a CPU hog arriving mid-run (about 90 s)"
exec examples/cpu_contention.sh

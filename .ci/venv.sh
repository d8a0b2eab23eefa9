# Sourced (bash) by .ci/run and examples/demo.sh: the one place that makes a virtual environment.
#
#   reveal_venv PY DIR [python -m venv options...]
#
# Leaves DIR/bin/python (with pip) built from interpreter PY.  A stock Debian 12 python3 is
# "externally managed" (PEP 668: pip refuses to install into it) and ships without pip or
# venv's pip bootstrap (ensurepip, package python3-venv): that package is installed with
# apt-get when PY cannot bootstrap pip (as root, or through sudo).  An existing DIR is kept
# when it was built from the same interpreter (prefix and version) and its pip runs;
# otherwise it is recreated (--clear), so switching PYTHON= never mixes two interpreters.

_reveal_as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

reveal_venv() {
    local py=$1 dir=$2
    shift 2
    local base want have
    base=$("$py" -c 'import sys; print(sys.executable)') \
        || { echo "reveal_venv: interpreter '$py' does not run" >&2; return 1; }
    want=$("$base" -c 'import sys; print(sys.prefix, sys.version)')
    if [[ -x $dir/bin/python ]] && "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
        have=$("$dir/bin/python" -c 'import sys; print(sys.base_prefix, sys.version)' 2>/dev/null \
            || true)
        [[ "$have" == "$want" ]] && return 0
    fi
    if ! "$base" -c 'import ensurepip, venv' 2>/dev/null; then
        # Debian/Ubuntu ship venv's pip bootstrap separately
        command -v apt-get >/dev/null || {
            echo "reveal_venv: $base cannot bootstrap pip into a venv (no ensurepip) and" \
                 "there is no apt-get to install python3-venv" >&2; return 1; }
        local pkgs=(python3-venv) v
        v=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        [[ $base == /usr/bin/* ]] && pkgs+=("python$v-venv")
        echo "reveal_venv: apt-get install ${pkgs[*]}" >&2
        _reveal_as_root apt-get update -qq
        _reveal_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${pkgs[@]}" >/dev/null
    fi
    echo "reveal_venv: $base -m venv ${*:+$* }$dir" >&2
    "$base" -m venv --clear "$@" "$dir"
}

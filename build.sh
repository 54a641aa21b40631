#!/usr/bin/env bash
# vllm-dcu: pinned vLLM 0.18.1 base + patches/series + kernels/ -> dist/vllm-0.18.1+dcu.<n>.<hash>-*.whl
#
#   ./build.sh                      fetch + verify the pinned wheel, apply the series, install kernels, stamp, pack
#   ./build.sh --upto 0002          ... only the series up to 0002     ./build.sh --without 0003,0004
#   ./build.sh --ablation           baseline + every cumulative prefix into dist/ablation/
#   ./build.sh --check | --list     apply only and report
#   ./build.sh --edit / --refresh   developer loop (see docs/developing.md)
#   ./build.sh --base-installed     overlay on the vllm installed in $PYTHON (the DCU container's 0.18.1+das...)
#   ./build.sh --base-wheel FILE    overlay on another wheel (e.g. a vllm_cscc build)
#   ./build.sh --source DIR         apply to a source checkout and run its own wheel build
# The steps live in tools/dcubuild/ (run as a module from the repository root); each prints one line.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
command -v git >/dev/null || { echo "error: git is required" >&2; exit 1; }
exec "$PY" -m tools.dcubuild "$@"

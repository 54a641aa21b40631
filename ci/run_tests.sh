#!/usr/bin/env bash
# The project's test command (README): CPU test suite in a cached virtual environment.
#   ci/run_tests.sh [pytest args]       e.g. ci/run_tests.sh -q ; ci/run_tests.sh -q tests/test_build.py
# Creates $VLLM_DCU_VENV (default ~/.cache/vllm-dcu/venv-cpu) on first use and installs ci/requirements-cpu.txt
# (torch CPU build, triton for its CPU interpreter, vLLM's pure-Python deps); reinstalls when that file changes.
# Prepares the patched vLLM tree the tests import and puts it first on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_DCU_VENV:-$HOME/.cache/vllm-dcu/venv-cpu}
PY3=${PYTHON3:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "test-env: creating $VENV"
  "$PY3" -m venv "$VENV"
fi
# VLLM_DCU_REQUIREMENTS_OVER: a second file installed over the first (ci/container_lane.sh: the container's stack)
reqs=(ci/requirements-cpu.txt ${VLLM_DCU_REQUIREMENTS_OVER:+"$VLLM_DCU_REQUIREMENTS_OVER"})
want=$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  for r in "${reqs[@]}"; do
    echo "test-env: installing $r into $VENV (first run: a few minutes)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$r"
  done
  echo "$want" > "$VENV/.requirements.sha256.tmp" && mv "$VENV/.requirements.sha256.tmp" "$VENV/.requirements.sha256"
fi
export PYTHON="$VENV/bin/python"
# The patched vLLM tree the tests import (tests/conftest.py checks it): VLLM_DCU_TREE, else build/test-tree,
# (re)built by the build tool when its inputs changed. VLLM_DCU_USE_INSTALLED=1 tests an installed vllm instead.
if [ "${VLLM_DCU_USE_INSTALLED:-}" != 1 ]; then
  tree=${VLLM_DCU_TREE:-$("$PYTHON" -m tools.dcubuild.testtree)}
  export PYTHONPATH="$tree:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PYTHON" -m pytest "$@"

#!/usr/bin/env bash
# GPU-box entry point: install the bundle made by ci/gpu/bundle.py and run one target against a variant.
#
#   bash ci/gpu/run.sh pytest [pytest args]    pytest -m gpu (default: tests/gpu)
#   bash ci/gpu/run.sh python SCRIPT [args]    any script, with the harness environment
#   bash ci/gpu/run.sh list                    the bundle's variants; * marks the one a target uses
#   VARIANT=<name> bash ci/gpu/run.sh ...      pick a variant (default: the last one bundled)
#
# Dependency wheels go to <tmp>/site and variants to <tmp>/variants/<name>/ (stand-ins applied; <tmp> is
# Python's tempfile.gettempdir(): $TMPDIR, else /tmp), once per
# machine. BUNDLE=<dir> uses another bundle folder than .bundle. Run from the repository root.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
export VLLM_DCU_BUNDLE="${BUNDLE:-${VLLM_DCU_BUNDLE:-$repo/.bundle}}"
# The multi-GPU box must never use NVLink multicast (KINDS.md); keep it off for every child process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
py="$(command -v python3 || command -v python)"
exec "$py" "$here/harness.py" "$@"

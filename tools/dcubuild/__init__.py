"""vllm-dcu build tool: pinned vLLM base + patches/series + kernels/ and dcu/ -> wheel.

build.sh runs ``python -m tools.dcubuild`` (cli.py); every verb prints one line per step. The recipe:

  fetch    download the pinned upstream wheel through pip into a cache (reused while its sha256 matches)
  verify   check size and sha256 against vendor/vllm-<version>.json
  unpack   extract the wheel's files into build/tree (compiled *.so stay in the wheel and are carried over
           byte for byte when packing), make the tree a git repository with a base commit
  apply    apply patches/series in order, no fuzz, one commit per patch (message = the patch's Subject)
  kernels  copy kernels/ and dcu/ into the tree as the packages vllm.dcu_kernels and vllm.dcu
           (benchmark and measurement scripts stay in the repository)
  stamp    write vllm/dcu_patchset.json and the PEP 440 version 0.18.1+dcu.<n>.<hash>
  pack     write the wheel (RECORD rebuilt) to a temporary name in dist/, then rename it

Modules, one concern each:
  common.py   errors, logging, hashing, subprocesses        series.py  pins, patch files, series, selection
  fetch.py    the base wheel and sdist through pip           tree.py    unpack, git apply, install packages
  stamp.py    version and vllm/dcu_patchset.json             wheel.py   reading and writing wheels
  verbs.py    build, ablation, check, tree                   edit.py    --edit / --refresh (developer loop)
  source.py   --source (a source checkout's own build)       testtree.py  the tests' cached patched tree
  installed.py  --base-installed (the vllm installed in this Python, written as a base wheel)
  cli.py      the command line

Errors end with one line ``error: ...`` on stderr and exit status 1 (2 for bad arguments); dist/ never holds a
partial wheel.
"""
from .common import BuildError

__all__ = ["BuildError"]

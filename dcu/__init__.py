"""vllm-dcu's vLLM-side modules (installed by build.sh as the package ``vllm.dcu``).

The patches in patches/ keep only short hooks into upstream files; what those hooks call lives here, as real
files that can be read, linted and unit-tested. Every build carries the package; a module is used only when
the patch whose hook imports it is applied, so an ablation build without that patch behaves as before.
Triton kernels live in kernels/ (``vllm.dcu_kernels``).
"""

"""vllm-dcu Triton kernels.

This folder is installed by ``build.sh`` into the patched vLLM tree as the
package ``vllm.dcu_kernels``; inside the repository it imports as ``kernels``.
Modules use relative imports only, so both names work.
"""

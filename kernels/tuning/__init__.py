"""The device decides: the tuned file one device's tuning run writes, the decisions the engine takes from it at start,
and the startup checks that fall back to upstream's path when a kernel of ours fails on the device.

``tuned_file``  the file's format, its identity (device, arch, Triton, torch, kernels hash), loading and writing;
``decisions``   which path runs for each launch kind (ours or upstream's) and why, logged as one table at start;
``emulation``   ``VLLM_DCU_EMULATE_ARCH``: run the DCU's code paths and table entries on another GPU (rehearsal).

Torch-free at import (the engine imports it before anything runs on the device).
"""

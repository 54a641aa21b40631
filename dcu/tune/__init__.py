"""``python -m vllm.dcu.tune``: measure our kernels against the upstream paths on this device and write the tuned
file the engine reads at start (kernels/tuning/tuned_file.py has its format).

For a model's shapes (``--model NAME`` or ``--model-config config.json``) it compiles each kernel the series adds at
the shapes the engine launches, checks it against the upstream path it replaces on random inputs, times both in one
process, and records per launch kind which side runs and why; ``--full`` first sweeps launch candidates around the
launch table's entry (kernels/tuning/candidates.py). Modules: ``shapes`` (models, cases), ``common`` (timing,
comparison), ``sweep`` (a kernel family's candidates and decisions), ``attention`` (decode, prefill), ``gemv``,
``kv_write``, ``report``, ``__main__`` (the command). Nothing is imported here, so ``vllm.dcu`` stays light.
"""

#!/bin/bash
# Session 9 call A: decode page_loop split plans (E, Efit, Afit) beside the table and bf16, the kernel before #15
# in its own process, then the GPU tests with Efit.
set -u
R=$OUT/r; mkdir -p $R
E='{"BLOCK_N":64,"num_stages":3,"early_convert":1,"page_loop":1}'
EFIT='{"BLOCK_N":64,"num_stages":3,"early_convert":1,"page_loop":1,"split_round":"down"}'
AFIT='{"BLOCK_N":64,"num_stages":3,"early_convert":0,"page_loop":1,"split_round":"down"}'
python -m kernels.decode_attention.bench --quick --tag s9 --out $R --kv8 "E=$E" --kv8 "Efit=$EFIT" --kv8 "Afit=$AFIT" > $R/s9.log 2>&1; echo "bench rc $?"
(cd .gpu/before15 && python -m kernels.decode_attention.bench --quick --tag before-15 --out $R) > $R/before15.log 2>&1; echo "before rc $?"
VLLM_DCU_DECODE_PARAMS="{\"kv8\":$EFIT}" timeout 150 python -m pytest -m gpu --noconftest -q tests/gpu/test_decode_attention_gpu.py > $R/tests-efit.log 2>&1; echo "tests rc $?"
tail -3 $R/tests-efit.log
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R

#!/bin/bash
# Session 9 call F (#17/#15): the kv8 entry's shortest split at batch 1-4 (the page loop pays only with several
# tiles per split): min_split_tokens 64 (sm90's) vs 128 / 256 for kv8 only.
set -u
R=$OUT/r; mkdir -p $R
B='"BLOCK_N":64,"num_stages":3,"early_convert":1,"page_loop":1,"split_round":"down"'
python -m kernels.decode_attention.bench --quick --tag min-split --out $R --batches 1,4 \
  --kv8 "m128={$B,\"min_split_tokens\":128}" --kv8 "m256={$B,\"min_split_tokens\":256}" > $R/ms.log 2>&1; echo "bench rc $?"
grep "^| " $R/*.md | grep -v fp8_pth_hw | cut -d'|' -f2-12
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R

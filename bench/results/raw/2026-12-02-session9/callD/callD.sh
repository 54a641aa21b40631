#!/bin/bash
# Session 9 call D (#14): named GEMV launch options against the table and cuBLAS at 1-8 rows, every shape.
set -u
R=$OUT/r; mkdir -p $R
python -m kernels.gemv.bench --variants --rows 1,2,4,8 --tag tries --out $R \
  --try 'n4k3={"1":{"DOT":0,"BLOCK_N":4,"BLOCK_K":1024,"num_stages":1,"K_STAGES":3}}' \
  --try 'k256s5={"1":{"DOT":0,"BLOCK_N":8,"BLOCK_K":256,"num_stages":1,"K_STAGES":5}}' \
  --try 'fk3={"2":{"DOT":0,"BLOCK_N":8,"BLOCK_K":512,"num_stages":1,"K_STAGES":3},"4":{"DOT":0,"BLOCK_N":4,"BLOCK_K":512,"num_stages":1,"K_STAGES":3},"8":{"DOT":0,"BLOCK_N":4,"BLOCK_K":256,"num_stages":1,"K_STAGES":3}}' \
  --try 'fk4={"2":{"DOT":0,"BLOCK_N":8,"BLOCK_K":256,"num_stages":1,"K_STAGES":4},"4":{"DOT":0,"BLOCK_N":4,"BLOCK_K":256,"num_stages":1,"K_STAGES":4},"8":{"DOT":0,"BLOCK_N":2,"BLOCK_K":256,"num_stages":1,"K_STAGES":4}}' \
  --try 'fk3n2={"8":{"DOT":0,"BLOCK_N":2,"BLOCK_K":512,"num_stages":1,"K_STAGES":3}}' \
  > $R/gemv.log 2>&1; echo "gemv rc $?"
tail -45 $R/*.md | cut -c1-160
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R

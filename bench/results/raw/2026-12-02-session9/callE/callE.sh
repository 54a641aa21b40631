#!/bin/bash
# Session 9 call E (#13): the series without 0006 (baseline, repeated) vs the full series, contest protocol.
set -u
bash ci/gpu/run.sh prepare > /dev/null 2>&1 || { echo "prepare failed"; exit 1; }
PYTHONPATH=$PWD/ci/gpu/diag bash ci/gpu/run.sh python -m bench.serve_bench --variants no0006,full --baseline no0006 \
  --tiers 4-8K,8-16K,16-32K --protocols contest --requests 3 --mode decode-graph --what contest-without-0006 \
  --deadline-s 545 2>&1 | tail -60

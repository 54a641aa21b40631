set +e
T=tests/gpu/test_decode_attention_gpu.py
P="python -m pytest -m gpu --noconftest -q -p no:cacheprovider"
echo "== new, by_dim"; CUDA_LAUNCH_BLOCKING=1 $P $T -x -k v_stored_by_dim 2>&1 | grep -v "^WARNING" | tail -25
echo "== old, by_dim"; (cd .gpu/base && $P $T -k v_stored_by_dim 2>&1 | tail -3)
echo "== new, by_dim, balance 0 in the test"; sed 's/json.dumps({"kv8": {"early_convert": early_convert}})/json.dumps({"balance": 0, "kv8": {"early_convert": early_convert}})/' $T > tests/gpu/test_da_nob.py; $P tests/gpu/test_da_nob.py -k v_stored_by_dim 2>&1 | tail -3
echo "== new, whole file minus by_dim"; $P $T -k "not v_stored_by_dim" 2>&1 | tail -3
which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null
CS=$(which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then echo "== sanitizer"; timeout 200 $CS --tool memcheck --print-limit 5 $P $T -x -k "v_stored_by_dim and 1-fp8-True" 2>&1 | grep -v "^WARNING" | head -60; fi

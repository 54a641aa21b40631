"""fp8 V by dim with the balanced plan forced on (decode_attention turns it off for that layout): run under
compute-sanitizer to see whether Triton 3.6's out-of-allocation shared store is still there for each early_convert."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
import kernels.decode_attention.decode_attention  # noqa: F401
da = sys.modules['kernels.decode_attention.decode_attention']
from kernels.decode_attention import launch_params
from tests.gpu.test_decode_attention_gpu import make_case, run, check
from tests.attention_checks import v_by_dim

orig = da._plan
da._plan = lambda *a, balance_ok=True, **k: orig(*a, **k)  # ignore balance_ok: balance as the entry says
for ec in (0, 1):
    os.environ[launch_params.ENV_VAR] = json.dumps({"kv8": {"early_convert": ec}})
    for sw in (False, True):
        case = make_case([5000, 1553, 3, 20000], 1552, kv_quant="fp8", seed=8)
        case["v_cache"] = v_by_dim(case["v_cache"])
        out = run(case, software_fp8=sw)
        torch.cuda.synchronize()
        check(out, case)
        print(f"early_convert {ec} software {sw}: balanced fp8 V by dim ok", flush=True)

"""Gluon compile probe (CPU, sm90): fp8 decode tile loop with Q in registers and K / V codes loaded from global
memory straight into mma_v2 operand layouts (no shared-memory staging but P's layout change)."""
import sys
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, "/work/main")
from kernels.compile_tools import gpu_target, ptxas_usage, nvdisasm, sass_tile_loop

_HW = gl.constexpr("""{
    .reg .b16 l, h;
    .reg .b32 a0, a1, k;
    mov.b32 k, 0x1c001c00;
    mov.b32 {l, h}, $2;
    cvt.rn.f16x2.e4m3x2 a0, l;
    cvt.rn.f16x2.e4m3x2 a1, h;
    mul.f16x2 $0, a0, k;
    mul.f16x2 $1, a1, k;
}""")


@gluon.jit
def probe(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, n_tiles, stride_vd, V_BY_DIM: gl.constexpr,
          BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr, PREFETCH: gl.constexpr = False):
    pid = gl.program_id(0)
    n_tok = n_tiles * BLOCK_N
    k_ptr += pid.to(gl.int64) * n_tok * 256
    v_ptr += pid.to(gl.int64) * n_tok * 256
    ks_ptr += pid * n_tok
    vs_ptr += pid * n_tok
    out_ptr += pid * 16 * 256
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NUM_WARPS], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # Q [16, 256] f16, straight into the A-operand layout, held across the loop
    qr = gl.arange(0, 16, layout=gl.SliceLayout(1, a_op))
    qc = gl.arange(0, 256, layout=gl.SliceLayout(0, a_op))
    q = gl.load(q_ptr + qr[:, None] * 256 + qc[None, :])
    # K^T [256 (d), BLOCK_N (tok)] codes in the B-operand layout
    kd = gl.arange(0, 256, layout=gl.SliceLayout(1, b_op))
    kt = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, b_op))
    # V [BLOCK_N (tok), 256 (d)] codes in the B-operand layout
    vt = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, b_op))
    vd = gl.arange(0, 256, layout=gl.SliceLayout(0, b_op))
    st = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    m_i = gl.full([16], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma))
    l_i = gl.full([16], 0.0, gl.float32, layout=gl.SliceLayout(1, mma))
    acc = gl.zeros([16, 256], gl.float32, layout=mma)
    kc = gl.load(k_ptr + kt[None, :] * 256 + kd[:, None])
    vc = gl.load(v_ptr + vd[None, :] * stride_vd + vt[:, None])
    for i in range(n_tiles):
        base = i * BLOCK_N
        if PREFETCH:
            nb = gl.minimum(i + 1, n_tiles - 1) * BLOCK_N
            kc_next = gl.load(k_ptr + (nb + kt[None, :]) * 256 + kd[:, None])
            vc_next = gl.load(v_ptr + vd[None, :] * stride_vd + nb + vt[:, None])
        else:
            kc = gl.load(k_ptr + (base + kt[None, :]) * 256 + kd[:, None])
        k16 = gl.inline_asm_elementwise(_HW, "=r,=r,r", [kc], dtype=gl.float16, is_pure=True, pack=4)
        s = mma_v2(q, k16, gl.zeros([16, BLOCK_N], gl.float32, layout=mma))
        ks = gl.load(ks_ptr + base + st)
        vs = gl.load(vs_ptr + base + st)
        s = s * ks[None, :]
        t = s + gl.log2(vs)[None, :]
        m_new = gl.maximum(m_i, gl.max(t, axis=1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(gl.exp2(s - m_new[:, None]), axis=1)
        p = gl.exp2(t - m_new[:, None])
        pa = gl.convert_layout(p.to(gl.float16), a_op)
        if not PREFETCH:
            if V_BY_DIM:
                vc = gl.load(v_ptr + vd[None, :] * stride_vd + base + vt[:, None])
            else:
                vc = gl.load(v_ptr + (base + vt[:, None]) * 256 + vd[None, :])
        v16 = gl.inline_asm_elementwise(_HW, "=r,=r,r", [vc], dtype=gl.float16, is_pure=True, pack=4)
        acc = mma_v2(pa, v16, acc * alpha[:, None])
        m_i = m_new
        if PREFETCH:
            kc = kc_next
            vc = vc_next
    o = acc / l_i[:, None]
    orow = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    ocol = gl.arange(0, 256, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + orow[:, None] * 256 + ocol[None, :], o)


def compile_probe(v_by_dim, block_n=64, num_warps=4, prefetch=False):
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"q_ptr": "*fp16", "k_ptr": "*u8", "v_ptr": "*u8", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
           "out_ptr": "*fp32", "n_tiles": "i32", "stride_vd": "i32", "V_BY_DIM": "constexpr", "BLOCK_N": "constexpr",
           "NUM_WARPS": "constexpr", "PREFETCH": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 7)}
    src = GluonASTSource(probe, sig, constexprs=dict(V_BY_DIM=v_by_dim, BLOCK_N=block_n, NUM_WARPS=num_warps,
                                                         PREFETCH=prefetch),
                         attrs=attrs)
    k = triton.compile(src, target=gpu_target("sm90"), options=dict(num_warps=num_warps))
    use = ptxas_usage(k.asm["ptx"], 90)
    loop = sass_tile_loop(nvdisasm(k.asm["cubin"]))
    return dict(shared=k.metadata.shared, **use, loop=loop["instructions"] if loop else None,
                ops=list(loop["ops"].items())[:10] if loop else None)


if __name__ == "__main__":
    for bn, nw, pf in ((64, 4, False), (64, 4, True), (32, 4, True), (64, 8, True), (32, 8, True)):
        try:
            print("v_by_dim BLOCK_N", bn, "warps", nw, "prefetch", pf, compile_probe(True, bn, nw, pf), flush=True)
        except Exception as e:
            print(bn, nw, pf, "ERROR", str(e)[-1500:], flush=True)

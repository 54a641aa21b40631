"""Gluon probe 2 (sm90): the 8-bit decode tile loop with a cp.async ring.

Per program: Q [16, 256] fp16 held in registers as the A operand; K codes [n_tok, 256] u8 (token rows) and V codes
by dim [256, n_tok] u8 (token-contiguous rows) stream through a STAGES-deep ring in shared memory by cp.async, with
the per-token K / V scales; each tile's codes go from shared memory straight into the mma_v2 B-operand layout
(KW consecutive reduction elements per thread: one 8-byte ld.shared for KW 8), are converted in registers
(hardware or software e4m3, or int8) and feed fp16 mma_v2 with float32 accumulation. Only P goes through shared
memory (its layout change). Same scale arithmetic as the Triton kernel (K scale on S's columns, log2 of the V
factor on the scores, l kept by its own exponential), with the row sum l kept per thread and reduced once at
the end.
"""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2, async_copy

_E4M3_HW = gl.constexpr("""{
    .reg .b16 l, h;
    mov.b32 {l, h}, $2;
    cvt.rn.f16x2.e4m3x2 $0, l;
    cvt.rn.f16x2.e4m3x2 $1, h;
}""")  # exact e4m3 value (the 2^8 the Triton kernel multiplies out goes into the factors here)
_E4M3_SW = gl.constexpr("""{
    .reg .b32 a0, a1;
    prmt.b32 a0, $2, 0, 0x9180;
    prmt.b32 a1, $2, 0, 0xb3a2;
    shl.b32 a0, a0, 7;
    shl.b32 a1, a1, 7;
    and.b32 $0, a0, 0xbf80bf80;
    and.b32 $1, a1, 0xbf80bf80;
}""")  # e4m3 value / 256
_INT8 = gl.constexpr("""{
    .reg .b32 u, a0, a1, k;
    mov.b32 k, 0x48804880;
    xor.b32 u, $2, 0x80808080;
    prmt.b32 a0, u, 0x4848, 0x4140;
    prmt.b32 a1, u, 0x4848, 0x4342;
    sub.f16x2 $0, a0, k;
    sub.f16x2 $1, a1, k;
}""")  # int8 value / 128


@gluon.jit
def _cvt(codes, KIND: gl.constexpr):
    if KIND == 0:
        return gl.inline_asm_elementwise(_E4M3_HW, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)
    elif KIND == 1:
        return gl.inline_asm_elementwise(_E4M3_SW, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)
    else:
        return gl.inline_asm_elementwise(_INT8, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit
def _issue(k_ring, v_ring, ks_ring, vs_ring, slot, tile, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_vd,
           kr, kc, vr, vc, sc, BLOCK_N: gl.constexpr):
    base = tile * BLOCK_N
    async_copy.async_copy_global_to_shared(k_ring.index(slot), k_ptr + (base + kr[:, None]) * 256 + kc[None, :])
    async_copy.async_copy_global_to_shared(v_ring.index(slot), v_ptr + vr[:, None] * stride_vd + base + vc[None, :])
    async_copy.async_copy_global_to_shared(ks_ring.index(slot), ks_ptr + base + sc)
    async_copy.async_copy_global_to_shared(vs_ring.index(slot), vs_ptr + base + sc)
    async_copy.commit_group()


@gluon.jit
def probe2(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, n_tiles, stride_vd, KIND: gl.constexpr,
           BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr, STAGES: gl.constexpr, KW: gl.constexpr,
           K_VEC: gl.constexpr, K_PHASE: gl.constexpr, V_VEC: gl.constexpr, V_PHASE: gl.constexpr):
    pid = gl.program_id(0)
    n_tok = n_tiles * BLOCK_N
    k_ptr += pid.to(gl.int64) * n_tok * 256
    v_ptr += pid.to(gl.int64) * n_tok * 256
    ks_ptr += pid * n_tok
    vs_ptr += pid * n_tok
    out_ptr += pid * 16 * 256
    if KIND == 0:
        unit: gl.constexpr = 1.0  # code -> value factor of _cvt
    elif KIND == 1:
        unit: gl.constexpr = 256.0
    else:
        unit: gl.constexpr = 128.0

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NUM_WARPS], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    # cp.async source layouts: 16 bytes per lane
    k_blk: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [NUM_WARPS, 1], [1, 0])
    v_blk: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_N, BLOCK_N // 16], [NUM_WARPS, 1], [1, 0])
    s_blk: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
    k_sh: gl.constexpr = gl.SwizzledSharedLayout(K_VEC, 1, K_PHASE, [1, 0])
    v_sh: gl.constexpr = gl.SwizzledSharedLayout(V_VEC, 1, V_PHASE, [1, 0])
    s_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    k_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 256], k_sh)
    v_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 256, BLOCK_N], v_sh)
    ks_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], s_sh)
    vs_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], s_sh)
    kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_blk))
    kc = gl.arange(0, 256, layout=gl.SliceLayout(0, k_blk))
    vr = gl.arange(0, 256, layout=gl.SliceLayout(1, v_blk))
    vc = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, v_blk))
    sc = gl.arange(0, BLOCK_N, layout=s_blk)

    for st in gl.static_range(STAGES - 1):
        _issue(k_ring, v_ring, ks_ring, vs_ring, st, gl.minimum(st, n_tiles - 1), k_ptr, v_ptr, ks_ptr, vs_ptr,
               stride_vd, kr, kc, vr, vc, sc, BLOCK_N)

    qr = gl.arange(0, 16, layout=gl.SliceLayout(1, a_op))
    qc = gl.arange(0, 256, layout=gl.SliceLayout(0, a_op))
    q = gl.load(q_ptr + qr[:, None] * 256 + qc[None, :])
    m_i = gl.full([16], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma))
    l_t = gl.zeros([16, BLOCK_N], gl.float32, layout=mma)  # per-thread share of l, reduced at the end
    acc = gl.zeros([16, 256], gl.float32, layout=mma)
    for i in range(n_tiles):
        slot = i % STAGES
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()  # every thread's copies of tile i landed; slot (i - 1) % STAGES is free
        _issue(k_ring, v_ring, ks_ring, vs_ring, (i + STAGES - 1) % STAGES, gl.minimum(i + STAGES - 1, n_tiles - 1),
               k_ptr, v_ptr, ks_ptr, vs_ptr, stride_vd, kr, kc, vr, vc, sc, BLOCK_N)
        kt = k_ring.index(slot).permute([1, 0]).load(b_op)  # K^T [256, BLOCK_N]
        s = mma_v2(q, _cvt(kt, KIND), gl.zeros([16, BLOCK_N], gl.float32, layout=mma))
        ks = ks_ring.index(slot).load(gl.SliceLayout(0, mma))
        vs = vs_ring.index(slot).load(gl.SliceLayout(0, mma))
        s = s * (ks * unit)[None, :]
        t = s + gl.log2(vs * unit)[None, :]
        m_new = gl.maximum(m_i, gl.max(t, axis=1))
        alpha = gl.exp2(m_i - m_new)
        l_t = l_t * alpha[:, None] + gl.exp2(s - m_new[:, None])
        p = gl.convert_layout(gl.exp2(t - m_new[:, None]).to(gl.float16), a_op)
        vt = v_ring.index(slot).permute([1, 0]).load(b_op)  # V [BLOCK_N, 256]
        acc = mma_v2(p, _cvt(vt, KIND), acc * alpha[:, None])
        m_i = m_new
    async_copy.wait_group(0)
    o = acc / gl.sum(l_t, axis=1)[:, None]
    orow = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    ocol = gl.arange(0, 256, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + orow[:, None] * 256 + ocol[None, :], o)


SIG = {"q_ptr": "*fp16", "k_ptr": "*u8", "v_ptr": "*u8", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "out_ptr": "*fp32",
       "n_tiles": "i32", "stride_vd": "i32"}
CONSTS = ("KIND", "BLOCK_N", "NUM_WARPS", "STAGES", "KW", "K_VEC", "K_PHASE", "V_VEC", "V_PHASE")
DEFAULT = dict(KIND=0, BLOCK_N=64, NUM_WARPS=4, STAGES=3, KW=8, K_VEC=32, K_PHASE=8, V_VEC=16, V_PHASE=4)


def compile_sm90(**kw):
    from triton.experimental.gluon._runtime import GluonASTSource
    from kernels.compile_tools import gpu_target
    c = dict(DEFAULT, **kw)
    sig = dict(SIG, **{k: "constexpr" for k in CONSTS})
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 7)}
    src = GluonASTSource(probe2, sig, constexprs=c, attrs=attrs)
    return triton.compile(src, target=gpu_target("sm90"), options=dict(num_warps=c["NUM_WARPS"]))

"""kernels/compile_tools.py: the SASS tile-loop reader that compile_check --tile-loop uses, and the AMDGCN resource
reader of the wave64 reports (no GPU, no compiler)."""
from kernels.compile_tools import amdgcn_usage, ptx_byte_loads, sass_tile_loop

# nvdisasm -c layout: labels at column 0, instructions as "/*addr*/ [@pred] OPCODE operands ;"
_SASS = """\
_kernel:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   IMAD R2, R3, R4, RZ ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0030*/                   LDS R5, [R6] ;
.L_x_3:
        /*0040*/                   LDSM.16.M88.4 R8, [R9] ;
        /*0050*/                   HMMA.16816.F32 R10, R8, R12, R10 ;
        /*0060*/              @!P1 F2FP.F16.E4M3.UNPACK_B R13, R14 ;
        /*0070*/                   HMMA.16816.F32 R16, R8, R18, R16 ;
        /*0080*/               @P2 BRA `(.L_x_3) ;
        /*0090*/                   IADD3 R7, R7, 0x1, RZ ;
        /*00a0*/               @P3 BRA `(.L_x_2) ;
        /*00b0*/                   BRA `(.L_x_4) ;
.L_x_4:
        /*00c0*/                   EXIT ;
"""


def test_the_tile_loop_is_the_smallest_loop_with_matrix_instructions():
    # .L_x_1 has no matrix instruction, .L_x_2 holds .L_x_3 (the inner one), the branch to .L_x_4 goes forward
    loop = sass_tile_loop(_SASS)
    assert loop == dict(instructions=5, ops={"HMMA": 2, "BRA": 1, "F2FP": 1, "LDSM": 1})


def test_no_loop_with_matrix_instructions_gives_none():
    assert sass_tile_loop(_SASS.replace("HMMA", "FFMA")) is None
    assert sass_tile_loop("") is None


# the shape of Triton's AMDGCN text: instructions indented, the kernel descriptor's fields as ".name: value"
_GCN = """\
_gemv_kernel:
\ts_load_dwordx4 s[0:3], s[0:1], 0x0
\tglobal_load_dwordx4 v[4:7], v[2:3], off
\tglobal_load_dwordx4 v[8:11], v[2:3], off offset:1024
\tbuffer_load_dwordx4 v[12:15], v0, s[4:7], 0 offen
\tglobal_load_dword v1, v[2:3], off
\tglobal_load_ushort v16, v[2:3], off
\tglobal_load_ubyte v17, v[2:3], off
\tv_mfma_f32_16x16x16bf16_1k v[20:23], v[4:5], v[8:9], v[20:23]
\ts_barrier
\tglobal_store_short v[2:3], v1, off
    .sgpr_count:     24
    .vgpr_count:     96
    .vgpr_spill_count: 0
    .private_segment_fixed_size: 0
"""


def test_amdgcn_usage_counts_registers_and_global_load_widths():
    u = amdgcn_usage(_GCN)
    # scalar loads (s_load) and stores are not global loads; buffer loads are
    assert u == dict(regs=96, sgprs=24, spills=0, scratch=0, barriers=1, loads=6, loads_16b=3, loads_1b=1, mfma=1)
    assert amdgcn_usage("") == dict(regs=None, sgprs=None, spills=None, scratch=None, barriers=0, loads=0,
                                    loads_16b=0, loads_1b=0, mfma=0)


def test_ptx_byte_loads_counts_one_byte_global_loads_only():
    ptx = """
    ld.global.b8 %rs1, [%rd1];
    ld.global.nc.u8 %rs2, [%rd2];
    @%p1 ld.global.L1::evict_last.s8 %rs3, [%rd3];
    ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd4];
    ld.global.b32 %r5, [%rd5];
    ld.shared.b8 %rs4, [%r6];
    st.global.b8 [%rd6], %rs1;
    """
    assert ptx_byte_loads(ptx) == 3

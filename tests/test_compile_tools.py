"""kernels/compile_tools.py: the SASS tile-loop reader that compile_check --tile-loop uses (no GPU, no compiler)."""
from kernels.compile_tools import sass_tile_loop

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

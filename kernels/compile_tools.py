"""Ahead-of-time compilation helpers for the kernels' compile_check scripts (no GPU needed; not in the wheel).

CUDA targets compile for the named sm through the ptxas Triton ships; ROCm targets (the DCU's gfx936 / gfx928)
for gfx90a, the wave64 target upstream LLVM knows, as their proxy.
"""
import os
import re
import subprocess
import tempfile

ROCM_PROXY = "gfx90a"


def gpu_target(target: str):
    """Triton's GPUTarget for a launch_params target name (sm90, gfx936, gfx928, rocm, ...)."""
    from triton.backends.compiler import GPUTarget

    if target.startswith("sm"):
        return GPUTarget("cuda", int(target[2:]), 32)
    if target.startswith("gfx") or target == "rocm":
        return GPUTarget("hip", ROCM_PROXY, 64)
    raise ValueError(f"compile_check: no compile target for {target!r} (use sm90, gfx936, gfx928, rocm)")


def jit_signature(fn, ptr_type, *, ones=(), div16=lambda name: True, scalars=None):
    """(signature, attrs, constexprs) for triton.compiler.ASTSource, as Triton's launcher specializes a real call:
    every pointer ``<name>_ptr`` has type ``ptr_type(<name>)`` and 16-byte alignment, the integers named in ``ones``
    are 1 there (the launcher turns them into constants), the other integers are i32 with the divisibility-by-16
    attribute where ``div16(name)`` says the real call's value has it; ``scalars`` maps non-integer arguments to their
    type. Arguments named in upper case are constexprs, left for the caller to fill. Without these the compiled code
    (registers above all) is not what runs."""
    sig, attrs, consts = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name.endswith("_ptr"):
            sig[name] = ptr_type(name[:-4])
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name[0].isupper() or name in ones:
            sig[name] = "constexpr"
            if name in ones:
                consts[name] = 1
        elif scalars and name in scalars:
            sig[name] = scalars[name]
        else:
            sig[name] = "i32"
            if div16(name):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs, consts


def run_cuda_tool(tool: str, data: str | bytes, suffix: str, args=()) -> subprocess.CompletedProcess:
    """Run one of the CUDA tools Triton ships (ptxas, nvdisasm, cuobjdump in backends/nvidia/bin) as ``tool *args
    FILE``, FILE a temporary file holding ``data`` (text or bytes) with ``suffix``; returns the finished process, its
    output as text, whatever its exit status."""
    import triton

    path_of_tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
    with tempfile.NamedTemporaryFile("wb" if isinstance(data, bytes) else "w", suffix=suffix, delete=False) as f:
        f.write(data)
        path = f.name
    try:
        return subprocess.run([path_of_tool, *args, path], capture_output=True, text=True)
    finally:
        os.unlink(path)


def ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers and spill-store bytes per thread from ``ptxas -v`` on ``ptx``, and ``serialized``: None, or the
    reason of ptxas's advisory that it serialized the wgmma pipeline (sm90: C7510-C7519, "Potential Performance
    Loss: wgmma.mma_async instructions are serialized due to ..."), shortened to "Cxxxx: reason"."""
    out = run_cuda_tool("ptxas", ptx, ".ptx", (f"-arch=sm_{arch}a", "-v", "-o", os.devnull))
    text = out.stderr + out.stdout
    regs = re.findall(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill stores", text)
    serial = re.search(r"\((C75\d\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized "
                       r"due to (.*?)(?: (?:in|for) the function|\.?$)", text, re.MULTILINE)
    return dict(regs=int(regs[-1]) if regs else None, spills=int(spills[-1]) if spills else None,
                serialized=f"{serial.group(1)}: {serial.group(2)[:120]}" if serial else None)


_PTX_BYTE_LOAD = re.compile(r"\bld\.global(?:\.[A-Za-z0-9_:]+)*?\.[bsu]8\b")


def ptx_byte_loads(ptx: str) -> int:
    """One-byte global loads (``ld.global....b8`` / ``u8`` / ``s8``) in a kernel's PTX: bytes gathered one by one."""
    return len(_PTX_BYTE_LOAD.findall(ptx))


_GCN_GLOBAL_LOAD = re.compile(r"^\s+(?:global|buffer)_load_(\w+)", re.MULTILINE)
_GCN_MFMA = re.compile(r"^\s+v_mfma_", re.MULTILINE)


def amdgcn_usage(gcn: str) -> dict:
    """VGPRs, SGPRs, VGPR spills, scratch bytes and barriers from a compiled kernel's AMDGCN assembly, and its global
    loads: how many instructions, how many of them 16 bytes wide per lane (``dwordx4``: what a bandwidth-bound
    kernel's stream should be) and how many one byte (``ubyte`` / ``sbyte``: bytes gathered one by one), and its MFMA
    instructions. Counts are of the instructions in the code, not of how often they run."""

    def field(name):
        m = re.search(rf"\.{name}:\s+(\d+)", gcn)
        return int(m.group(1)) if m else None

    widths = _GCN_GLOBAL_LOAD.findall(gcn)
    return dict(regs=field("vgpr_count"), sgprs=field("sgpr_count"), spills=field("vgpr_spill_count"),
                scratch=field("private_segment_fixed_size"), barriers=gcn.count("s_barrier"),
                loads=len(widths), loads_16b=sum(w == "dwordx4" for w in widths),
                loads_1b=sum(w.startswith(("ubyte", "sbyte")) for w in widths), mfma=len(_GCN_MFMA.findall(gcn)))


_SASS_INSTR = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_SASS_LABEL = re.compile(r"^\.(L_x_\d+):")
_SASS_BACK_BRANCH = re.compile(r"\bBRA\s+`\(\.(L_x_\d+)\)")
_MATRIX_OPS = ("HMMA", "IMMA", "HGMMA", "IGMMA", "QMMA")


def sass_tile_loop(sass: str) -> dict | None:
    """The tile loop of a kernel's SASS (``nvdisasm -c`` text): the smallest loop, from a label to a branch back to
    it, that holds matrix instructions. Returns its instruction count and its opcodes with their counts, most
    frequent first, or None when no loop holds one. That is what one step of the kernel's main loop issues per
    thread, the number to set against the step's time (instructions x warps / cycles per step = issue rate)."""
    lines = sass.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = _SASS_LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
    best = None
    for i, line in enumerate(lines):
        m = _SASS_BACK_BRANCH.search(line)
        if not m or labels.get(m.group(1), i) >= i:
            continue
        ops = [mm.group(1) for mm in map(_SASS_INSTR.match, lines[labels[m.group(1)]:i + 1]) if mm]
        if any(op in _MATRIX_OPS for op in ops) and (best is None or len(ops) < len(best)):
            best = ops
    if best is None:
        return None
    counts = {}
    for op in best:
        counts[op] = counts.get(op, 0) + 1
    return dict(instructions=len(best), ops=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))


def nvdisasm(cubin: bytes) -> str:
    """``nvdisasm -c`` of a cubin, with the nvdisasm Triton ships."""
    out = run_cuda_tool("nvdisasm", cubin, ".cubin", ("-c",))
    if out.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {out.stderr.strip()[-300:]}")
    return out.stdout

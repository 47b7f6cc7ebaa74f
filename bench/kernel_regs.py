#!/usr/bin/env python3
"""Registers, spills and shared memory of every kernel of a kernels/*.cu file, as ptxas reports them,
compiled for sm_90 by NVRTC on this machine (no GPU needed): the check for register spills after a
change to a kernel (a spill is local memory traffic in the inner loop).

Usage: bench/kernel_regs.py kernels/cast.cu [NAME_SUBSTRING] [--cubin OUT.cubin] [-D NAME[=VALUE]]
With -D NAME the file is compiled with NAME defined, as a family that shares it is (cast.cu with
CAST_SRC_UNIT: the computed-source casts, capture/src/backend/cuda/kernels.rs Family::CastSrc);
-D 'NAME(D)=VALUE' overrides a tuning macro (flash_attention.cu's FA_MT_FWD(D), for one).
With --cubin the compiled sm_90 cubin is written too, for nvdisasm (the nvidia-cuda-nvdisasm wheel:
`nvdisasm -c OUT.cubin` lists every kernel's SASS, the instructions it really runs).
Needs libnvrtc (the nvidia-cuda-nvrtc wheel, as .ci/run installs it) and CUDA's headers (the
nvidia-cuda-runtime wheel's include/, or $CUDA_INCLUDE)."""
import ctypes
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "kernels")


def nvidia_dir():
    import site
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        for d in sorted(glob.glob(os.path.join(sp, "nvidia", "cu*"))) + [os.path.join(sp, "nvidia", "cuda_nvrtc")]:
            if glob.glob(os.path.join(d, "lib", "libnvrtc.so*")):
                return d
    sys.exit("kernel_regs.py: no libnvrtc found (pip install nvidia-cuda-nvrtc)")


def main():
    args = sys.argv[1:]
    cubin_out = None
    if "--cubin" in args:
        i = args.index("--cubin")
        if i + 1 >= len(args):
            sys.exit("kernel_regs.py: --cubin needs a file name")
        cubin_out = args[i + 1]
        del args[i:i + 2]
    defines = []
    while "-D" in args:
        i = args.index("-D")
        if i + 1 >= len(args):
            sys.exit("kernel_regs.py: -D needs a macro name")
        defines.append(args[i + 1])
        del args[i:i + 2]
    if not args or not os.path.isfile(args[0]):
        sys.exit("usage: bench/kernel_regs.py kernels/FILE.cu [NAME_SUBSTRING] [--cubin OUT.cubin] [-D NAME[=VALUE]]")
    want = args[1] if len(args) > 1 else ""
    d = nvidia_dir()
    # NVRTC dlopens its builtins library by name: loaded first, it is found without LD_LIBRARY_PATH.
    for b in sorted(glob.glob(os.path.join(d, "lib", "libnvrtc-builtins.so*"))):
        if ".alt." not in b:
            ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))[0])
    src = open(args[0]).read()
    # The translation unit the backend compiles (capture/src/backend/cuda/kernel_units.rs: HEADERS):
    # each `#include "X.cuh"` of kernels/ replaced by that header's text, the headers' own includes
    # (common.cuh's formats.cuh) too.
    # Only #include lines count (a header's comments name its own #include), each header pasted once.
    include = re.compile(r'^#include "(\w+\.cuh)"', re.M)
    pasted = set()
    while (m := include.search(src)) is not None:
        name = m.group(1)
        text = "" if name in pasted else open(os.path.join(KERNELS, name)).read()
        pasted.add(name)
        src = src[:m.start()] + text + src[m.end():]
    src = "".join(f"#define {m.replace('=', ' ', 1)}\n" for m in defines) + src
    inc = os.environ.get("CUDA_INCLUDE", os.path.join(d, "include"))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None) != 0:
        sys.exit("kernel_regs.py: nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=sm_90", b"--std=c++17", b"--include-path=" + inc.encode(), b"--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        # The error lines (ptxas's verbose lines can bury them); the log's end where there are none.
        text = log.value.decode()
        errors = "\n".join(l for l in text.splitlines() if "error" in l.lower()) or text[-2000:]
        sys.exit(f"kernel_regs.py: NVRTC: {lib.nvrtcGetErrorString(rc).decode()}\n{errors}")
    if cubin_out:
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, buf)
        with open(cubin_out, "wb") as f:
            f.write(buf.raw)
    fn, row = None, {}
    print(f"{'kernel':<28} {'registers':>9} {'spill stores':>12} {'spill loads':>11} {'smem bytes':>10}")
    for line in log.value.decode().splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn, row = m.group(1), {}
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            row["st"], row["ld"] = m.groups()
        m = re.search(r"Used (\d+) registers", line)
        if m and fn and want in fn:
            smem = re.search(r"(\d+) bytes smem", line)
            print(f"{fn:<28} {m.group(1):>9} {row.get('st', '?'):>12} {row.get('ld', '?'):>11} {smem.group(1) if smem else 0:>10}")


if __name__ == "__main__":
    main()

"""Where a PyTorch peer's step goes on the GPU: runs a peer script (torch_tiny.py or torch_llama.py)
unchanged, profiles the steps it times (the loop between its two CUDA events, after its warmup and
compilation) with torch.profiler, and prints the kernels' GPU milliseconds a step, grouped into the
spans fp8-capture's FP8SCOPE_PROFILE=1 prints, then the heaviest kernels by name.

Usage (on a machine with a GPU and PyTorch):
  python3 bench/peer_profile.py bench/torch_tiny.py --variant compile_fused --batch 32 --steps 5
  python3 bench/peer_profile.py bench/torch_llama.py --preset llama-1b --steps 3
Every argument after the script is the peer's own. Writes the trace's kernel list as JSON lines to
$PEER_PROFILE_JSONL when set.
"""
import collections
import json
import os
import re
import runpy
import sys
import tempfile

import torch

# (span, pattern on the kernel's name), first match wins; names are Inductor's, cuBLAS's, FlashAttention's.
GROUPS = [
    # cuDNN's SDPA (what PyTorch picks on an H200): flash_bprop, with dot(dO, O) and dQ's conversion.
    ("attention_bwd", r"flash_bwd|flash_bprop|dot_do_o|convert_dq|fmha.*bwd|attention_backward|_bwd_kernel|dot_product.*backward"),
    ("attention_fwd", r"flash_fwd|fmha|flash|attention"),
    ("gemm", r"nvjet|gemm|cutlass|xmma|sm90_|cublas|splitK"),
    ("adamw", r"adam|multi_tensor|foreach"),
    ("crossentropy", r"log_softmax|nll_loss|cross_entropy|softmax"),
    ("norm", r"layer_norm|rms|norm|rsqrt|mean_pow"),
    ("activation", r"gelu|silu|sigmoid|erf|mul_\d+|tanh"),
    ("embedding", r"embedding|index_put|indexing_backward|scatter|gather"),
    ("memset/copy", r"^Memset|^Memcpy|fill|zero|copy|cat_|clone"),
    ("add/other elementwise", r"add|sum|elementwise|vectorized|reduce|triton"),
]


def group_of(name):
    for g, pat in GROUPS:
        if re.search(pat, name, re.IGNORECASE):
            return g
    return "other"


class _Profiled:
    """Starts the profiler at the peer's first timed CUDA event and stops it at the second."""

    def __init__(self, script):
        self.script = os.path.abspath(script)
        self.n_records = 0
        self.prof = None
        self.trace = None

    def install(self):
        original = torch.cuda.Event.record
        me = self

        def record(ev, *a, **k):
            r = original(ev, *a, **k)
            # Only the peer's own events: Inductor's autotuning times its candidates with events too.
            if os.path.abspath(sys._getframe(1).f_code.co_filename) == me.script:
                me.n_records += 1
                if me.n_records == 1:
                    me.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                    me.prof.__enter__()
                elif me.n_records == 2:
                    torch.cuda.synchronize()
                    me.prof.__exit__(None, None, None)
                    fd, me.trace = tempfile.mkstemp(suffix=".json")
                    os.close(fd)
                    me.prof.export_chrome_trace(me.trace)
            return r

        torch.cuda.Event.record = record


def steps_arg(argv, default):
    for i, a in enumerate(argv):
        if a == "--steps" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--steps="):
            return int(a.split("=", 1)[1])
    return default


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: peer_profile.py PEER_SCRIPT [peer arguments]")
    script, peer_args = sys.argv[1], sys.argv[2:]
    steps = steps_arg(peer_args, 30 if "tiny" in script else 20)
    p = _Profiled(script)
    p.install()
    sys.argv = [script] + peer_args
    runpy.run_path(script, run_name="__main__")
    if p.trace is None:
        sys.exit("peer_profile: the peer recorded no timed CUDA events")
    with open(p.trace) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(p.trace)
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e]
    by_group, by_name = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        for table, key in ((by_group, group_of(e["name"])), (by_name, e["name"])):
            table[key][0] += e["dur"] / 1e3 / steps
            table[key][1] += 1 / steps
    total = sum(v[0] for v in by_group.values())
    print(f"== peer GPU profile: {steps} steps, kernels' GPU ms a step (sum of kernel durations; calls a step)")
    for g, (ms, n) in sorted(by_group.items(), key=lambda kv: -kv[1][0]):
        print(f"  {g:<26} {ms:9.3f} {n:7.1f}")
    print(f"  {'total (kernels)':<26} {total:9.3f}")
    print("== heaviest kernels")
    for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:40]:
        print(f"  {ms:8.3f} {n:6.1f}  {group_of(name):<14} {name[:150]}")
    out = os.environ.get("PEER_PROFILE_JSONL")
    if out:
        with open(out, "w") as f:
            for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
                f.write(json.dumps({"kernel": name, "group": group_of(name), "ms_step": ms, "calls_step": n}) + "\n")


if __name__ == "__main__":
    main()

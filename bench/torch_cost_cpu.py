"""The recorder's cost on the CPU, before and after batching: bench/torch_tiny.py's model (Linear
attention; D, L, T from the environment: D=128 L=4 T=64 by default, batch 4, vocabulary V=512), eager,
one thread, AdamW; rounds of 20 steps after 3, interleaving no recorder, the batched recorder and the
reference path (batched=False: the recorder before batching), statistics every step, dumps every 50,
recipe delayed; prints the best of the rounds and each ratio. FUSED=1 compiles the statistics.

    python3 bench/torch_cost_cpu.py 3                 # 3 rounds
    D=32 T=8 L=12 python3 bench/torch_cost_cpu.py 3   # a model where the recorder's Python dominates
"""
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import fp8scope.torch  # noqa: E402
import torch_tiny as tt  # noqa: E402


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    env = lambda k, d: int(os.environ.get(k, d))  # noqa: E731
    torch.set_num_threads(1)
    tt.VOCAB, tt.D, tt.LAYERS, tt.HEADS = env("V", 512), env("D", 128), env("L", 4), 4
    tt.FFN = 4 * tt.D
    torch.manual_seed(0)
    model = tt.Model(attn=nn.Linear, ffn_lin=nn.Linear)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tok = torch.randint(0, tt.VOCAB, (4, env("T", 64)))
    tgt = torch.randint(0, tt.VOCAB, tok.shape)

    def timed(rec, n):
        t = time.perf_counter()
        for _ in range(n):
            loss = F.cross_entropy(model(tok).view(-1, tt.VOCAB), tgt.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rec is not None:
                rec.step(loss)
        return (time.perf_counter() - t) / n * 1e3

    res = {"off": [], "batched": [], "reference": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            for k in res:
                rec = None if k == "off" else fp8scope.torch.Recorder(
                    model, out=f"{d}/{k}{r}", recipe="delayed", dump_every=50, flush_every=1000,
                    batched=k == "batched", fused=os.environ.get("FUSED") == "1")
                timed(rec, 3)
                res[k].append(timed(rec, 20))
                if rec is not None:
                    rec.close()
    base = min(res["off"])
    print(f"D {tt.D} L {tt.LAYERS} T {tok.shape[1]}, best of {rounds} rounds of 20 steps, ms/step (ratio):",
          ", ".join(f"{k} {min(v):.2f} ({min(v) / base:.3f}x)" for k, v in res.items()))


if __name__ == "__main__":
    main()

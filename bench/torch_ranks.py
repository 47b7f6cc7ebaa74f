"""The PyTorch recorder in a distributed job: what it costs per step and what it writes per rank.

Model: bench/torch_tiny.py's shape by default (12 pre-LN layers, C 1024, FFN 4096, 16 heads, batch
4 × 512 per rank, vocabulary 32000) with torchao's `convert_to_float8_training` on every Linear of the
layers (qkv, attention out, FFN 1 and 2: 48 Float8Linear sites; the head stays BF16), fp32 master
weights, bf16 autocast, AdamW. On a GPU torchao runs its real FP8 GEMMs (`emulate=False`), on the CPU
its emulation. Wrapped in DDP or FSDP2 (`--wrap`) under torchrun (any number of ranks, NCCL on GPUs,
gloo on the CPU), or in nothing for one process.

  overhead   ms/step, side by side in one process, of: no recorder; the recorder with `casts=False`
             (fp8scope's statistics only); with the casts table (audit_every=10, the default); with
             the cast audit at every step (audit_every=1) — at stats_every 1 and 10. Prints one
             RESULT line (JSON) on rank 0.
  bytes      records --steps steps (flush_every --flush-every) and reports, for rank 0: rows and
             bytes per step of each table, the size of each part, of the liveness file and of
             run.json. Prints one RESULT line (JSON) on rank 0.

Usage:
  torchrun --nproc-per-node N bench/torch_ranks.py overhead [--wrap ddp|fsdp] [--steps 20]
  torchrun --nproc-per-node N bench/torch_ranks.py bytes --out DIR [--steps 100 --flush-every 25]
  python3 bench/torch_ranks.py bytes --out DIR --layers 12 --dim 64 --ffn 256 --seq 64   (CPU, one process)
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import fp8scope.torch  # noqa: E402
from fp8scope import parts, ranks as rk  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Layer(nn.Module):
    def __init__(self, d, ffn, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn = Attention(d, heads)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        x = x + self.self_attn(self.ln1(x))
        return x + self.linear2(F.gelu(self.linear1(self.ln2(x))))


class Net(nn.Module):
    def __init__(self, vocab, d, ffn, heads, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d, ffn, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tok):
        x = self.emb(tok)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


def build(a, device):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    net = Net(a.vocab, a.dim, a.ffn, a.heads, a.layers).to(device)
    convert_to_float8_training(net, config=Float8LinearConfig(emulate=device.type != "cuda"),
                               module_filter_fn=lambda m, fqn: fqn.startswith("layers."))
    if a.wrap == "ddp" and dist.is_initialized():
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    elif a.wrap == "fsdp" and dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for layer in net.layers:
            fully_shard(layer)
        fully_shard(net)
        model = net
    else:
        model = net
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4)


def train_steps(model, opt, tok, steps, rec=None, device=None):
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rec is not None:
            rec.step(loss)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def setup():
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return device, rank


def shared_dir(base: str, rank: int) -> str:
    """One fresh run directory per variant, the same path on every rank."""
    name = [None]
    if rank == 0:
        name[0] = tempfile.mkdtemp(prefix="fp8scope-ranks-", dir=base)
        os.rmdir(name[0])
    if dist.is_initialized():
        dist.broadcast_object_list(name, src=0)
    return name[0]


def overhead(a, device, rank):
    model, opt = build(a, device)
    g = torch.Generator().manual_seed(rank)
    tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(device)
    base = a.out or tempfile.mkdtemp(prefix="fp8scope-bench-")
    variants = [("none", None)]
    for se in (1, 10):
        variants += [(f"stats{se}_nocasts", dict(stats_every=se, casts=False)),
                     (f"stats{se}_casts", dict(stats_every=se)),
                     (f"stats{se}_audit1", dict(stats_every=se, audit_every=1))]
    train_steps(model, opt, tok, a.warmup, device=device)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "world_size": dist.get_world_size() if dist.is_initialized() else 1, "wrap": a.wrap,
              "model": f"{a.layers} layers, C {a.dim}, FFN {a.ffn}, batch {a.batch}x{a.seq}", "ms_per_step": {}}
    for rnd in range(a.rounds):
        for name, kw in variants:
            rec = None
            if kw is not None:
                rec = fp8scope.torch.Recorder(model, out=shared_dir(base, rank), **kw)
            t = train_steps(model, opt, tok, a.steps, rec=rec, device=device)
            if rec is not None:
                rec.close()
            result["ms_per_step"].setdefault(name, []).append(statistics.median(t[2:]))
    med = {k: statistics.median(v) for k, v in result["ms_per_step"].items()}
    result["median_ms"] = med
    result["ratio"] = {k: round(v / med["none"], 3) for k, v in med.items()}
    if rank == 0:
        for k, v in med.items():
            print(f"{k:18s} {v:9.2f} ms/step  ×{result['ratio'][k]:.3f}")
        print("RESULT " + json.dumps(result), flush=True)


def nbytes(a, device, rank):
    model, opt = build(a, device)
    g = torch.Generator().manual_seed(rank)
    tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(device)
    os.makedirs(a.out, exist_ok=True)
    run = shared_dir(a.out, rank)
    rec = fp8scope.torch.Recorder(model, out=run, flush_every=a.flush_every, stats_every=a.stats_every,
                                  audit_every=a.audit_every)
    t = train_steps(model, opt, tok, a.steps, rec=rec, device=device)
    rec.close()
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        return
    live = rk.read_liveness(run)[0]
    tables = {}
    for table in ("steps", "stats", "casts", "tensors", "events", "shadow"):
        files = parts.closed_parts(run, table, rank=0)
        sizes = [os.path.getsize(f) for f in files]
        rows = live["rows"].get(table, 0)
        tables[table] = {"rows_per_step": rows / a.steps, "bytes_per_step": round(sum(sizes) / a.steps, 1),
                         "parts": len(sizes), "part_bytes": sizes}
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "world_size": dist.get_world_size() if dist.is_initialized() else 1, "wrap": a.wrap,
              "model": f"{a.layers} layers, C {a.dim}, FFN {a.ffn}, batch {a.batch}x{a.seq}",
              "steps": a.steps, "flush_every": a.flush_every, "stats_every": a.stats_every,
              "ms_per_step": statistics.median(t[2:]), "tables": tables,
              "liveness_bytes": os.path.getsize(rk.liveness_path(run, 0)),
              "run_json_bytes": os.path.getsize(os.path.join(run, "run.json")),
              "bytes_per_rank_per_step": round(sum(v["bytes_per_step"] for v in tables.values()), 1)}
    import pyarrow.parquet as pq

    casts = pq.read_table(parts.closed_parts(run, "casts", rank=0), partitioning=None).to_pylist()
    result["audits"] = {k: sum(r[k] or 0 for r in casts) for k in ("audit_checked", "audit_mismatched", "master_checked",
                                                                   "master_mismatched")}
    result["audits"]["stale"] = sum(1 for r in casts if r["master_changed"] and r["forward_changed"] is False)
    print("audits (rank 0):", result["audits"])
    for k, v in tables.items():
        if v["parts"]:
            print(f"{k:8s} {v['rows_per_step']:7.1f} rows/step {v['bytes_per_step']:9.1f} B/step  parts {v['part_bytes']}")
    print("RESULT " + json.dumps(result), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("overhead", "bytes"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--wrap", choices=("ddp", "fsdp", "none"), default="ddp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flush-every", type=int, default=25)
    ap.add_argument("--stats-every", type=int, default=1)
    ap.add_argument("--audit-every", type=int, default=10)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    device, rank = setup()
    if a.mode == "overhead":
        overhead(a, device, rank)
    else:
        if a.out is None:
            ap.error("bytes needs --out")
        nbytes(a, device, rank)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

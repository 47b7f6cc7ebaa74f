"""The PyTorch recorder's cost, side by side: step time with and without `fp8scope.torch.Recorder`
(statistics every step, dumps every 50 steps) on the same model, optimizer and batch, in one process.

Models (each in eager mode and under torch.compile):
  tiny         bench/torch_tiny.py's model with Linear attention projections (torch_recorder.py's
               overhead model: 12 layers, C 1024, batch 4 x 512), BF16 autocast, recipe delayed
  llama-small  Hugging Face LlamaForCausalLM at fp8-capture's llama-small preset (V 4096, C 256,
               F 704, L 4, 8 heads, 4 kv heads, batch 8 x 128), in BF16 and with torchao's
               Float8Linear on the decoder layers' projections
  llama-1b     the same at the llama-1b preset (V 32000, C 2048, F 8192, L 16, 32 heads, 8 kv heads,
               batch 4 x 2048)
BF16 runs record with recipe "delayed" (the default), Float8Linear runs with "current" (torchao's own
scaling). Each configuration: warmup steps (step 1 compiles and dumps), then --steps timed steps
(CUDA-synchronised wall time; step 50 dumps), first without the recorder, then with it; the
recorder's own report (the manifest's recorder_cost) is kept beside.

Writes OUT/torch_cost.json and OUT/torch_cost.md (OUT: --out, else $OUT, else ./out); prints the
table. A configuration that would not fit the time left (--budget-s) is skipped and says so.
--tiny shrinks every model (and runs on the CPU where there is no GPU) to check the script.
"""
import argparse
import contextlib
import json
import os
import re
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

LLAMA = {
    "llama-small": dict(vocab=4096, dim=256, ffn=704, layers=4, heads=8, kv_heads=4, batch=8, seq=128),
    "llama-1b": dict(vocab=32000, dim=2048, ffn=8192, layers=16, heads=32, kv_heads=8, batch=4, seq=2048),
}
TINY_LLAMA = dict(vocab=256, dim=64, ffn=128, layers=2, heads=4, kv_heads=2, batch=2, seq=32)
#: Today's figures before batching (python/README.md, issue 57), for the table.
BEFORE = {("tiny", "bf16", "eager"): 4.72, ("tiny", "bf16", "compile"): 1.30,
          ("hf-llama-8L-C512", "bf16", "compile"): 1.02, ("hf-llama-8L-C512", "fp8", "compile"): 1.29}


def llama(p, fp8: bool, dev):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=p["vocab"], hidden_size=p["dim"], intermediate_size=p["ffn"],
                      num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                      num_key_value_heads=p["kv_heads"], max_position_embeddings=p["seq"],
                      rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig(emulate=dev.type != "cuda"),
                                   module_filter_fn=lambda m, fqn: ".layers." in f".{fqn}")
    return model, (lambda fwd, tok: fwd(input_ids=tok, use_cache=False).logits), p


def tiny(small: bool, dev):
    import torch_tiny as tt

    if small:
        tt.VOCAB, tt.D, tt.LAYERS, tt.FFN, tt.HEADS = 256, 64, 2, 128, 4
    torch.manual_seed(0)
    model = tt.Model(attn=nn.Linear, ffn_lin=nn.Linear).to(dev)
    p = dict(vocab=tt.VOCAB, batch=2 if small else 4, seq=32 if small else 512)
    return model, (lambda fwd, tok: fwd(tok)), p


def run_config(name, prec, mode, a, dev, work):
    small = a.tiny
    if name == "tiny":
        model, call, p = tiny(small, dev)
    else:
        model, call, p = llama(TINY_LLAMA if small else LLAMA[name], prec == "fp8", dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev.type == "cuda")
    fwd = torch.compile(model) if mode == "compile" else model
    V = p["vocab"]
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, V, (p["batch"], p["seq"]), generator=g).to(dev)
    tgt = torch.randint(0, V, (p["batch"], p["seq"]), generator=g).to(dev)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()

    def step(rec):
        with amp:
            logits = call(fwd, tok)
        loss = F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rec is not None:
            rec.step(loss, tokens=tok.numel())
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(rec, n):
        sync()
        t = time.perf_counter()
        for _ in range(n):
            step(rec)
        sync()
        return (time.perf_counter() - t) / n * 1e3

    out = {"model": name, "precision": prec, "mode": mode, "shape": p}
    t0 = time.perf_counter()
    timed(None, a.warmup)
    off = timed(None, a.steps)
    out["compile_off_s"] = round(time.perf_counter() - t0, 1)
    recipe = "current" if prec == "fp8" else "delayed"
    run = os.path.join(work, f"{name}-{prec}-{mode}")
    # dynamo does not guard on module hooks: code compiled before the Recorder existed would run
    # without its hooks; start the compiled side afresh (its compile time is not timed).
    torch._dynamo.reset()
    rec = fp8scope.torch.Recorder(model, out=run, recipe=recipe, stats_every=1, dump_every=a.dump_every,
                                  flush_every=1000, fused=a.fused, casts=a.casts, batched=not a.reference)
    t1 = time.perf_counter()
    timed(rec, a.warmup)
    on = timed(rec, a.steps)
    rec.close()
    out["compile_on_s"] = round(time.perf_counter() - t1, 1)
    with open(os.path.join(run, "run.json")) as f:
        m = json.load(f)
    out.update(off_ms=round(off, 3), on_ms=round(on, 3), ratio=round(on / off, 4), recipe=recipe,
               recorder_cost=m.get("recorder_cost"), status=m["status"], rows=m["rows"],
               sites=len(m["origin"]["modules"]))
    return out


def write(a, dev, results, start) -> str:
    """The JSON and the markdown table of the results so far (rewritten after each configuration, so
    that a run stopped by its time limit keeps what it measured)."""
    meta = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "steps": a.steps, "warmup": a.warmup, "dump_every": a.dump_every, "tiny": a.tiny, "casts": a.casts,
            "reference": a.reference,
            "seconds": round(time.perf_counter() - start, 1)}
    try:
        import torchao
        meta["torchao"] = torchao.__version__
    except ImportError:
        pass
    with open(os.path.join(a.out, "torch_cost.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    lines = [f"Recorder cost on {meta['device']} (torch {meta['torch']}{', tiny shapes' if a.tiny else ''}): "
             f"statistics every step, dumps every {a.dump_every}; {a.steps} timed steps after {a.warmup}"
             f"{'; the reference (per-operand) path' if a.reference else ''}.", "",
             "| model | precision | mode | without ms/step | with ms/step | ratio | before | recorder's own report |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        before = BEFORE.get((r["model"], r["precision"], r["mode"]))
        if "off_ms" in r:
            c = r.get("recorder_cost") or {}
            own = (f"{100 * c['share']:.1f}% (host {c['host_ms']:.2f} ms"
                   + (f", device {c['device_ms']:.2f} ms" if c.get("device_ms") is not None else "") + ")") if c else "-"
            lines.append(f"| {r['model']} | {r['precision']} | {r['mode']} | {r['off_ms']:.2f} | {r['on_ms']:.2f} | "
                         f"{r['ratio']:.3f}x | {f'{before:.2f}x' if before else '-'} | {own} |")
        else:
            lines.append(f"| {r['model']} | {r['precision']} | {r['mode']} | - | - | {r.get('skipped') or r.get('error')} | "
                         f"{f'{before:.2f}x' if before else '-'} | - |")
    lines += ["", "Before (batching): HF llama 8 layers C512 batch 16x512 compile: BF16 1.02x, Float8Linear 1.29x."]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "torch_cost.md"), "w") as f:
        f.write(md)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "./out"), help="folder for the JSON and markdown (default $OUT or ./out)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per side (default 60: step 50 of the recorder dumps)")
    ap.add_argument("--warmup", type=int, default=6, help="untimed steps first (step 1 compiles and dumps)")
    ap.add_argument("--dump-every", type=int, default=50)
    ap.add_argument("--fused", default="auto", choices=["auto", "true", "false"],
                    help="the recorder's fused statistics (auto: compiled on CUDA)")
    ap.add_argument("--casts", default=True, action=argparse.BooleanOptionalAction,
                    help="record torchao's own casts (the casts table, the recorder's default) in FP8 runs")
    ap.add_argument("--reference", action="store_true",
                    help="record with the per-operand reference path (batched=False: the recorder before batching)")
    ap.add_argument("--budget-s", type=float, default=500.0, help="stop starting configurations after this many seconds")
    ap.add_argument("--only", default=None, help="regex over 'model/precision/mode' choosing the configurations")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a check of the script; the CPU when no GPU)")
    a = ap.parse_args()
    a.fused = {"auto": "auto", "true": True, "false": False}[a.fused]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" and not a.tiny:
        sys.exit("torch_cost.py: needs a CUDA GPU (or --tiny to check the script on the CPU)")
    os.makedirs(a.out, exist_ok=True)
    # Cheapest first, so that a tight budget still measures the most configurations.
    configs = [("tiny", "bf16", "eager"), ("tiny", "bf16", "compile")]
    for name, modes in (("llama-small", ("compile", "eager")), ("llama-1b", ("eager", "compile"))):
        for mode in modes:
            for prec in ("bf16", "fp8"):
                configs.append((name, prec, mode))
    if a.only:
        configs = [c for c in configs if re.search(a.only, "/".join(c))]
    start = time.perf_counter()
    results, spent = [], {}
    with tempfile.TemporaryDirectory() as work:
        for c in configs:
            left = a.budget_s - (time.perf_counter() - start)
            # A first llama-1b compile (two compilations and a dump variant) needs minutes.
            first = 150.0 if c[:3:2] == ("llama-1b", "compile") and not a.tiny else 0.0
            guess = spent.get((c[0], c[2]), first) * 1.2
            if left <= 0 or guess > left:
                results.append({"model": c[0], "precision": c[1], "mode": c[2], "skipped": f"time: {left:.0f} s left"})
                print(f"skip {'/'.join(c)}: {left:.0f} s left", flush=True)
                continue
            t = time.perf_counter()
            try:
                r = run_config(*c, a, dev, work)
            except Exception as e:  # noqa: BLE001 - one configuration failing must not lose the others
                r = {"model": c[0], "precision": c[1], "mode": c[2], "error": f"{type(e).__name__}: {e}"[:500]}
            r["seconds"] = round(time.perf_counter() - t, 1)
            spent[(c[0], c[2])] = max(spent.get((c[0], c[2]), 0.0), r["seconds"])
            results.append(r)
            print(json.dumps(r), flush=True)
            write(a, dev, results, start)
            torch._dynamo.reset()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    print(write(a, dev, results, start))
    bad = [r for r in results if "error" in r]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

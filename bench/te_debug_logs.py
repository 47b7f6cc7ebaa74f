"""Writes real Transformer Engine / nvdlfw_inspect statistics logs for `fp8-analyze import te-debug`.

Trains small models for a few dozen steps with the debug tooling's own statistics features switched
on through its YAML config, and leaves the logs where `fp8-analyze import te-debug` reads them:

  OUT/plain_torch/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log
      a plain PyTorch MLP (torch.nn.Linear) whose activations, weights, outputs and gradients are
      handed to nvdlfw_inspect's own LogTensorStats (min, max, mean, std, l1_norm, l2_norm) by
      forward and backward hooks; runs on CUDA or the CPU;
  OUT/te_fp8/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log
      only when transformer_engine imports and a GPU that runs FP8 is present: te.Linear layers
      under DelayedScaling with TE's LogTensorStats and LogFp8TensorStats (underflows%,
      overflows%, scale_inv_min/max, mse, and a what-if fp8_current_scaling_underflows%).

Each part runs in its own process (nvdlfw_inspect initialises once per process), so a failing TE
part leaves the plain part's logs whole. Needs torch and nvdlfw-inspect (pip install
nvdlfw-inspect); prints every version it used and fails with one clear line when one is missing.

Usage:
  python3 bench/te_debug_logs.py OUT_DIR [--steps 40] [--device cuda|cpu]
  fp8-analyze import te-debug OUT_DIR/plain_torch --out runs/plain
  fp8-analyze import te-debug OUT_DIR/te_fp8 --out runs/te --recipe delayed
"""
import argparse
import os
import subprocess
import sys

PLAIN_CONFIG = """\
plain_tensor_stats:
  enabled: True
  layers:
    layer_name_regex_pattern: .*
  LogTensorStats:
    enabled: True
    tensors: [activation, weight, output, gradient, dgrad, wgrad]
    stats: [min, max, mean, std, l1_norm, l2_norm]
    freq: 1
"""

TE_CONFIG = """\
te_fp8_stats:
  enabled: True
  layers:
    layer_name_regex_pattern: .*
  transformer_engine:
    LogTensorStats:
      enabled: True
      tensors: [activation, weight, gradient, output, wgrad, dgrad]
      stats: [min, max, mean, std, l1_norm, l2_norm, cur_amax, dynamic_range]
      freq: 1
    LogFp8TensorStats:
      enabled: True
      tensors_struct:
        - tensor: activation
          stats: [underflows%, scale_inv_min, scale_inv_max, mse, fp8_current_scaling_underflows%]
          freq: 1
        - tensor: gradient
          stats: [underflows%, overflows%, scale_inv_min, scale_inv_max, mse]
          freq: 1
        - tensor: weight
          stats: [underflows%, scale_inv_min, scale_inv_max, mse]
          freq: 1
"""


def die(msg):
    print(f"te_debug_logs: {msg}", file=sys.stderr)
    sys.exit(2)


def need(module, hint):
    try:
        return __import__(module)
    except ImportError as e:
        die(f"{module} is not importable ({e}); {hint}")


def versions():
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "nvdlfw-inspect", "transformer-engine", "transformer_engine", "pyyaml"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def batches(torch, steps, device, width, seed):
    """A learnable regression task: y = tanh(x · A) with fixed A, fresh x every step."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(width, width, generator=g) / width**0.5
    for _ in range(steps):
        x = torch.randn(64, width, generator=g)
        yield x.to(device), torch.tanh(x @ a).to(device)


def run_plain(out, steps, device):
    torch = need("torch", "install PyTorch")
    need("nvdlfw_inspect", "pip install nvdlfw-inspect")
    import nvdlfw_inspect.api as debug_api

    cfg = os.path.join(out, "config.yaml")
    os.makedirs(out, exist_ok=True)
    with open(cfg, "w") as f:
        f.write(PLAIN_CONFIG)
    debug_api.initialize(config_file=cfg, log_dir=out, default_logging_enabled=True)
    torch.manual_seed(0)
    width = 128
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    ).to(device)
    names = {m: f"model.{n}" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    step = {"i": 0}

    def log(name, tensor_name, t):
        debug_api.log_tensor_stats(
            layer_name=name, tensor_name=tensor_name, tensor=t.detach().float(), iteration=step["i"], skip_reduction=True
        )

    def fwd(m, inp, outp):
        log(names[m], "activation", inp[0])
        log(names[m], "weight", m.weight)
        log(names[m], "output", outp)

    def bwd(m, grad_in, grad_out):
        log(names[m], "gradient", grad_out[0])
        if grad_in[0] is not None:
            log(names[m], "dgrad", grad_in[0])

    for m in names:
        m.register_forward_hook(fwd)
        m.register_full_backward_hook(bwd)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(batches(torch, steps, device, width, 0)):
        step["i"] = i
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for m, name in names.items():
            log(name, "wgrad", m.weight.grad)
        opt.step()
        debug_api.step()
        if i % 10 == 0 or i == steps - 1:
            print(f"plain step {i:3d} loss={loss.item():.5f}")
    debug_api.end_debug()


def run_te(out, steps):
    torch = need("torch", "install PyTorch")
    need("nvdlfw_inspect", "pip install nvdlfw-inspect")
    te = need("transformer_engine.pytorch", "install transformer_engine[pytorch]")
    import nvdlfw_inspect.api as debug_api
    import transformer_engine
    from transformer_engine.common.recipe import DelayedScaling, Format

    if not torch.cuda.is_available():
        die("the TE part needs a CUDA GPU")
    features = os.path.join(os.path.dirname(transformer_engine.__file__), "debug", "features")
    if not os.path.isdir(features):
        die(f"this transformer_engine has no debug features at {features} (TE 2.4 or newer has them)")
    cfg = os.path.join(out, "config.yaml")
    os.makedirs(out, exist_ok=True)
    with open(cfg, "w") as f:
        f.write(TE_CONFIG)
    debug_api.initialize(config_file=cfg, feature_dirs=[features], log_dir=out, default_logging_enabled=True)
    torch.manual_seed(0)
    width = 256
    model = torch.nn.Sequential(
        te.Linear(width, 4 * width, name="model.layers.0.mlp.fc_1"),
        torch.nn.GELU(),
        te.Linear(4 * width, width, name="model.layers.0.mlp.fc_2"),
    ).cuda()
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(batches(torch, steps, "cuda", width, 1)):
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            pred = model(x)
        loss = torch.nn.functional.mse_loss(pred.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        debug_api.step()
        if i % 10 == 0 or i == steps - 1:
            print(f"te step {i:3d} loss={loss.item():.5f}")
    debug_api.end_debug()


def stats_log(part_dir):
    return os.path.join(part_dir, "nvdlfw_inspect_statistics_logs", "nvdlfw_inspect_globalrank-0.log")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to write the logs under (must not hold earlier logs)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="plain part's device (default: cuda if available)")
    ap.add_argument("--part", choices=["plain", "te"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.part == "plain":
        return run_plain(os.path.join(a.out, "plain_torch"), a.steps, a.device)
    if a.part == "te":
        return run_te(os.path.join(a.out, "te_fp8"), a.steps)

    torch = need("torch", "install PyTorch")
    need("nvdlfw_inspect", "pip install nvdlfw-inspect")
    for part in ("plain_torch", "te_fp8"):
        if os.path.exists(stats_log(os.path.join(a.out, part))):
            die(f"{os.path.join(a.out, part)} already holds logs; choose another OUT_DIR")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print("versions:", ", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"device: {device}" + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""))
    me = [sys.executable, os.path.abspath(__file__), a.out, "--steps", str(a.steps)]
    rc = subprocess.call(me + ["--part", "plain", "--device", device])
    if rc != 0:
        die(f"the plain PyTorch part failed (exit {rc})")
    print(f"wrote {stats_log(os.path.join(a.out, 'plain_torch'))}")
    try:
        import transformer_engine.pytorch  # noqa: F401

        have_te = torch.cuda.is_available()
        why = "no CUDA GPU" if not have_te else ""
    except Exception as e:  # TE missing or broken: the plain part stands alone
        have_te, why = False, f"transformer_engine not importable ({e.__class__.__name__}: {e})"
    if not have_te:
        print(f"TE part skipped: {why}")
        return 0
    rc = subprocess.call(me + ["--part", "te"])
    if rc != 0:
        print(f"TE part failed (exit {rc}); the plain part's logs are complete")
        return 1
    print(f"wrote {stats_log(os.path.join(a.out, 'te_fp8'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)

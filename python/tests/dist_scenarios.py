"""Distributed training scenarios recorded by `fp8scope.torch.Recorder`, for `torchrun` on the CPU
(gloo): a small MLP stack converted with torchao's `convert_to_float8_training(emulate=True)`, wrapped
in DDP, FSDP2 (`fully_shard`), tensor parallelism with torchao's `Float8ColwiseParallel` /
`Float8RowwiseParallel` and a sequence-parallel input, or FSDP2 × tensor parallelism on a 2-D mesh;
each run recorded into OUT/<scenario> with nothing but the Recorder line.

Faults are planted here, never in the library:
- `tp-localamax`: from step FAULT_STEP, layers.0.fc1's sequence-parallel input is cast with the amax
  of this rank's shard alone (torchtitan #3109): its scale differs across the TP group;
- `ddp-replica`: before step FAULT_STEP, rank 1 alone scales layers.1.fc2's weight by 1.5 and moves
  one element: its replicas' scale and bytes differ across the data-parallel group from then on (a
  scaling alone would leave the bytes equal: x·1.5 at scale s/1.5);
- `fsdp-stale` / `ddp-stale`: from step FAULT_STEP, layers.0.fc1's forward keeps the weight it had then
  (gradients still reach the master, which the optimizer keeps updating): a stale forward weight,
  visible from step FAULT_STEP + 1;
- `ddp-corrupt`: at step CORRUPT_STEP, on rank 1, four bytes of the FP8 data of layers.0.fc2's input
  cast are flipped after torchao's cast (a kernel that wrote wrong bytes);
- `ddp-refuse`: every rank creates a Recorder into the existing run OUT/ddp-clean-s0 and into a
  non-empty directory, and writes the error it got to OUT/ddp-refuse/rank<r>.txt;
- `ddp-crash`: rank 1 raises at step 3 (every later scenario is skipped: the job ends);
- `ddp-kill`: rank 2 (rank 1 in a job of 2) kills itself with SIGKILL after step 4 (the recorder
  writes a step's rows at the next step: step 2's part, flushed at step 3, is closed by then).

gloo has no float8 collectives: the FP8 all-gathers of sequence parallelism are sent as uint8 here
(`_gloo_float8_all_gather`), which moves the same bytes.

Usage (under torchrun): dist_scenarios.py OUT SCENARIO[,SCENARIO…] [--steps N]
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8scope.torch  # noqa: E402

FAULT_STEP = 3
CORRUPT_STEP = 4
CORRUPT_BYTES = 4
CRASH_STEP = 3
KILL_STEP = 4
C, F, B, T, LAYERS = 32, 64, 8, 16, 2

_faults = {"local_amax": False, "corrupt_armed": False}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(C, F, bias=False), nn.Linear(F, C, bias=False)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x


def _gloo_float8_all_gather():
    """Float8 all-gathers of torchao's tensor-parallel styles, sent as uint8 (gloo has no float8)."""
    from torchao.float8 import float8_ops
    from torchao.float8.float8_training_tensor import Float8TrainingTensor

    def gather(aten_op, args, kwargs=None):
        x = args[0]
        out = aten_op(x._data.contiguous().view(torch.uint8), *args[1:], **(kwargs or {}))
        return Float8TrainingTensor(out.view(x._data.dtype), x._scale, x._orig_dtype, x._linear_mm_config,
                                    x._gemm_input_role)

    def wait(aten_op, args, kwargs=None):
        x = args[0]
        out = aten_op(x._data.view(torch.uint8), *args[1:], **(kwargs or {}))
        return Float8TrainingTensor(out.view(x._data.dtype), x._scale, x._orig_dtype, x._linear_mm_config,
                                    x._gemm_input_role)

    for ns in (torch.ops._c10d_functional, torch.ops.c10d_functional):
        float8_ops.FLOAT8_OPS_TABLE[ns.all_gather_into_tensor.default] = gather
        float8_ops.FLOAT8_OPS_TABLE[ns.wait_tensor.default] = wait


def _corrupting_cast():
    """torchao's saturated FP8 conversion, with CORRUPT_BYTES bytes flipped on the call it is armed for."""
    import torchao.float8.float8_training_tensor as ftt

    orig = ftt.to_fp8_saturated

    def to_fp8_saturated(x, float8_dtype):
        out = orig(x, float8_dtype)
        if _faults["corrupt_armed"] and float8_dtype == torch.float8_e4m3fn:
            _faults["corrupt_armed"] = False
            local = out.to_local() if hasattr(out, "to_local") else out
            bits = local.view(torch.uint8)
            bits.view(-1)[:CORRUPT_BYTES] ^= 0x01
        return out

    ftt.to_fp8_saturated = to_fp8_saturated


class LocalAmaxColwise:
    """Float8ColwiseParallel whose input cast, while `_faults['local_amax']`, scales the local shard by
    its own amax (no reduction over the group): torchtitan #3109."""

    @staticmethod
    def make(**kw):
        from torch.distributed.tensor import DTensor
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel
        from torchao.float8.float8_training_tensor import GemmInputRole

        class Colwise(Float8ColwiseParallel):
            @staticmethod
            def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
                if not _faults["local_amax"]:
                    return Float8ColwiseParallel._prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs,
                                                                   device_mesh)
                x = inputs[0]
                local = x.to_local() if isinstance(x, DTensor) else x
                f8 = hp_tensor_to_float8_dynamic(local, mod.config.cast_config_input.target_dtype, mod.linear_mm_config,
                                                 gemm_input_role=GemmInputRole.INPUT)
                dt = DTensor.from_local(f8, device_mesh, input_layouts, run_check=False)
                if input_layouts != desired_input_layouts:
                    dt = dt.redistribute(placements=desired_input_layouts, async_op=True)
                return dt

        return Colwise(**kw)


def stale_forward(mod, state):
    """layers.0.fc1's forward with the weight frozen once `state['frozen']` is armed (a straight-through
    copy: the values are the frozen ones, the gradient reaches the current weight)."""
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    def forward(x):
        w = mod.weight
        if state.get("armed"):
            if state.get("frozen") is None:
                state["frozen"] = w.detach().clone()
            w = w + (state["frozen"] - w).detach()
        return matmul_with_hp_or_float8_args.apply(x, w.t(), mod.linear_mm_config, mod.config)

    mod.forward = forward


def build(kind: str, seed: int, rank: int, world: int):
    """(model to train, model to record, how each step's input is cut): the same initial weights on
    every rank (seed), the parallelism of `kind`."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(seed)
    net = Net()
    convert_to_float8_training(net, config=Float8LinearConfig(emulate=True))
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(net)
        return model, model, "dp"
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for b in net.layers:
            fully_shard(b)
        fully_shard(net)
        return net, net, "dp"
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module
    from torchao.float8.float8_tensor_parallel import Float8RowwiseParallel

    if kind == "tp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        tp = mesh
    elif kind == "fsdp_tp":
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_shard", "tp"))
        tp = mesh["tp"]
    else:
        raise ValueError(kind)
    for i, b in enumerate(net.layers):
        colwise = LocalAmaxColwise.make(input_layouts=Shard(1)) if i == 0 else None
        if colwise is None:
            from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel

            colwise = Float8ColwiseParallel(input_layouts=Shard(1))
        parallelize_module(b, tp, {"fc1": colwise, "fc2": Float8RowwiseParallel(output_layouts=Shard(1))})
    if kind == "fsdp_tp":
        from torch.distributed.fsdp import fully_shard

        for b in net.layers:
            fully_shard(b, mesh=mesh["dp_shard"])
        fully_shard(net, mesh=mesh["dp_shard"])
        return net, net, "dp_tp"
    return net, net, "tp"


def batch(step: int, seed: int, rank: int, world: int, split: str):
    """This rank's input and target at `step`: data-parallel ranks draw their own; a tensor-parallel
    group shares one batch, each rank holding its slice of the sequence (sequence parallelism)."""
    if split == "dp":
        g = torch.Generator().manual_seed(1000 * seed + 17 * step + rank)
        return torch.randn(B, T, C, generator=g), torch.randn(B, T, C, generator=g)
    dp_index, tp_size = (0, world) if split == "tp" else (rank // 2, 2)
    g = torch.Generator().manual_seed(1000 * seed + 17 * step + 101 * dp_index)
    x, y = torch.randn(B, T, C, generator=g), torch.randn(B, T, C, generator=g)
    tp_rank = rank % tp_size
    return x.chunk(tp_size, dim=1)[tp_rank].contiguous(), y.chunk(tp_size, dim=1)[tp_rank].contiguous()


def refuse(out: str, rank: int, world: int) -> None:
    """Every rank's error for a directory that holds a run, and for one that holds something else."""
    model, _, _ = build("ddp", 0, rank, world)
    here = os.path.join(out, "ddp-refuse")
    if rank == 0:
        os.makedirs(os.path.join(here, "other"), exist_ok=True)
        with open(os.path.join(here, "other", "notes.txt"), "w") as f:
            f.write("not a run\n")
    dist.barrier()
    said = []
    for target in (os.path.join(out, "ddp-clean-s0"), os.path.join(here, "other")):
        try:
            fp8scope.torch.Recorder(model, out=target)
            said.append("no error")
        except Exception as e:  # noqa: BLE001 - the test compares what every rank got
            said.append(f"{type(e).__name__}: {e}")
    with open(os.path.join(here, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(said) + "\n")


def run(out: str, name: str, steps: int, rank: int, world: int) -> None:
    kind, variant, seed = name.split("-")[0], name.split("-")[1], 0
    if variant == "refuse":
        return refuse(out, rank, world)
    if name.rsplit("-", 1)[-1].startswith("s") and name.rsplit("-", 1)[-1][1:].isdigit():
        seed = int(name.rsplit("-", 1)[-1][1:])
    model, recorded, split = build(kind, seed, rank, world)
    net = model.module if hasattr(model, "module") else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stale = {}
    if variant == "stale":
        stale_forward(net.layers[0].fc1, stale)
    if variant == "corrupt":
        fc2 = net.layers[0].fc2
        fc2.register_forward_pre_hook(lambda m, a: _faults.update(corrupt_armed=rec.step_no == CORRUPT_STEP
                                                                  and rank == 1))
    flush = 2 if variant in ("kill", "crash") else 25
    audit = 2 if variant == "corrupt" else 10
    # The only line a user adds. recipe="current": fp8scope's statistics of each operand then describe
    # the cast torchao makes (dynamic scaling from the tensor's own amax).
    rec = fp8scope.torch.Recorder(recorded, out=os.path.join(out, name), recipe="current", optimizer=opt,
                                  flush_every=flush, audit_every=audit)
    with rec:
        for step in range(1, steps + 1):
            _faults["local_amax"] = variant == "localamax" and step >= FAULT_STEP
            stale["armed"] = variant == "stale" and step >= FAULT_STEP
            if variant == "replica" and step == FAULT_STEP and rank == 1:
                with torch.no_grad():
                    w = net.layers[1].fc2.weight
                    w.mul_(1.5)
                    w[0, 0] += 0.01
            x, y = batch(step, seed, rank, world, split)
            loss = (model(x) - y).pow(2).mean()
            if variant == "crash" and step == CRASH_STEP and rank == 1:
                raise RuntimeError(f"planted crash on rank {rank} at step {step}")
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step(loss)
            if variant == "kill" and step == KILL_STEP and rank == min(2, world - 1):
                os.kill(os.getpid(), signal.SIGKILL)
    _faults.update(local_amax=False, corrupt_armed=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("scenarios")
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    _gloo_float8_all_gather()
    _corrupting_cast()
    for name in a.scenarios.split(","):
        t0 = time.time()
        run(a.out, name, a.steps, rank, world)
        dist.barrier()
        if rank == 0:
            print(f"scenario {name}: {time.time() - t0:.2f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

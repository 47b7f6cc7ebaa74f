"""A step's statistics in bulk: the operands a step's hooks saw, reduced together at the end of the
backward pass (or at `step()`), delayed scaling's amax history kept on the device, and the step's
results copied to the host once, asynchronously, to be read at the next step.

- `operand_batch` computes the raw vectors of many operands in one call: in a loop of
  `fp8scope.torch.stats.operand_stats` (eager: the very per-operand computation of the reference
  path, so the two agree bit for bit), or as one torch.compile'd multi-tensor function called per chunk of
  16 operands (`fused`): one guard check and one generated program for 16 operands instead of two
  compiled calls per operand.
- `DeviceHistory` is `fp8scope.recipe.Recipe`'s amax history and `fp8.scale_for_amax` on the
  device: a ring buffer per (module, role), updated in float32 with the step's amaxes without
  the host seeing them, so the next step's scales are ready before the host reads the last one.
- `HostCopy` concatenates a step's pieces (float64; int64 bit-cast to float64) into one tensor,
  copies it into pinned memory with `non_blocking` and records an event; `values()` waits on that
  event (by then long passed) and splits the copy back into the pieces.
"""

from __future__ import annotations

import numpy as np
import torch

from .stats import current_scale, operand_stats

#: Operands per compiled multi-tensor call: one compiled program per (format, level, recipe kind)
#: serves every chunk (shapes dynamic), so compile time stays that of 16 reductions.
CHUNK = 16


def batch_fn(fmt: str, level: int, kind: str, margin: int):
    """The multi-tensor statistics function for one (format, level, recipe kind): xs a list of 2-D
    operands, `buf` the (2, slots) float32 scales and amaxes they come from and `idx` each operand's
    slot (both ignored by current scaling, which computes each operand's own), returning an
    (n, fields) float64 tensor."""
    def stats(xs, buf, idx):
        out = []
        for i, x in enumerate(xs):
            if kind == "current":
                s, u = current_scale(x, fmt, margin)
            else:
                s, u = buf[0, idx[i]], buf[1, idx[i]]
            out.append(operand_stats(x, fmt, s, u, level))
        return torch.stack(out)
    return stats


class DeviceHistory:
    """Transformer Engine's DelayedScaling on the device, for `n` (module, role) slots: `scales` is a
    (2, n) float32 tensor, row 0 the scale of each slot's next cast and row 1 the amax it comes from
    ((1, 0) while a slot's history is empty), updated in place by `observe` — the same numbers as
    `Recipe.delayed_scale` after `Recipe.observe` (zero and non-finite amaxes skipped, `max` or
    `most_recent` over the last `length` amaxes, `(fp8_max / amax) / 2^margin` in float32, clamped)."""

    def __init__(self, fmt_max: list[float], length: int, algo: str, margin: int, device):
        n = len(fmt_max)
        self.length, self.algo = int(length), algo
        self.hist = torch.zeros(n, self.length, dtype=torch.float32, device=device)
        self.pos = torch.zeros(n, dtype=torch.int64, device=device)
        self.count = torch.zeros(n, dtype=torch.int64, device=device)
        self.rows = torch.arange(n, device=device)
        self.fmt_max = torch.tensor(fmt_max, dtype=torch.float32, device=device)
        self.two_m = torch.full((n,), 2.0 ** margin, dtype=torch.float32, device=device)
        self.scales = torch.stack([torch.ones(n), torch.zeros(n)]).float().to(device)

    def observe(self, amax: torch.Tensor) -> None:
        """Pushes this step's amax of every slot (float64 (n,), 0 for a slot not seen)."""
        a = amax.to(self.hist.device).float()
        valid = (a != 0) & torch.isfinite(a)
        self.hist[self.rows, self.pos] = torch.where(valid, a, self.hist[self.rows, self.pos])
        step = valid.to(torch.int64)
        self.pos.copy_((self.pos + step) % self.length)
        self.count.copy_(torch.clamp(self.count + step, max=self.length))
        if self.algo == "max":
            red = self.hist.amax(dim=1)
        else:
            red = self.hist[self.rows, (self.pos - 1) % self.length]
        s = (self.fmt_max / red) / self.two_m
        big, tiny = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny
        s = torch.where(torch.isnan(s), torch.full_like(s, big), s).clamp(tiny, big)
        has = (self.count > 0) & (red > 0) & torch.isfinite(red)
        self.scales[0].copy_(torch.where(has, s, torch.ones_like(s)))
        self.scales[1].copy_(torch.where(has, red, torch.zeros_like(red)))


class HostCopy:
    """One step's pieces on their way to the host: one concatenation and one device-to-host copy
    (asynchronous into pinned memory on CUDA), read back with `values()`."""

    def __init__(self, pieces: list[torch.Tensor]):
        self.spans: list[tuple[int, int, bool]] = []
        flat, at = [], 0
        for p in pieces:
            v = p.reshape(-1)
            is_int = v.dtype == torch.int64
            v = v.view(torch.float64) if is_int else v.double()
            self.spans.append((at, v.numel(), is_int))
            at += v.numel()
            flat.append(v)
        self.event = None
        if not flat:
            self.host = np.zeros(0)
            return
        devices = {v.device for v in flat}
        if len(devices) > 1:  # pieces on several devices (rare): each to the host on its own
            flat = [v.cpu() for v in flat]
        cat = torch.cat(flat)
        if cat.device.type == "cuda":
            buf = torch.empty(cat.shape, dtype=cat.dtype, pin_memory=True)
            buf.copy_(cat, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            self._buf = buf
        else:
            self._buf = cat if cat.device.type == "cpu" else cat.to("cpu")
        self.host = None

    def values(self) -> list[np.ndarray]:
        """Every piece as a numpy vector (int64 pieces as int64), once the copy has landed."""
        if self.host is None:
            if self.event is not None:
                self.event.synchronize()
            self.host = self._buf.numpy()
        out = []
        for at, n, is_int in self.spans:
            v = self.host[at: at + n]
            out.append(v.view(np.int64) if is_int else v)
        return out

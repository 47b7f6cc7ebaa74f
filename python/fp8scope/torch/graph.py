"""The recorder inside a torch.compile'd graph: what the hooks do while dynamo traces them, so that a
compiled model keeps one graph (no break at recorded modules) and the statistics are compiled with
the model (Inductor fuses their reductions with the model's own kernels, torchao's casts included).

Each operand's statistics are a row of `ROW` float64 values: a count (1 per call), the device raw
vector of `fp8scope.torch.stats.operand_stats` at the FULL level, and numel. Forward operands
(activation, weight) are added into a (slots, ROW) buffer the recorder owns; the gradient's row
comes back through autograd: `GradTap` is the identity on the module's output, and its backward
returns the gradient's row as the gradient of a (slots, ROW) leaf tensor (`sink`), so that
autograd accumulates every module's row into `sink.grad` without any hook running in the backward
graph. Non-finite outputs are counted into a (sites,) buffer. `step()` reads all three with the
step's other pieces (one copy) and zeroes them.
"""

from __future__ import annotations

import torch

from ..session import FULL
from .stats import DEVICE_FIELDS, current_scale, operand_stats

#: count, the FULL device fields, numel.
ROW = 1 + len(DEVICE_FIELDS[FULL]) + 1


def operand_row(t: torch.Tensor, fmt: str, scales: torch.Tensor, slot: int, current: bool, margin: int) -> torch.Tensor:
    """The (ROW,) float64 row of one operand (2-D, detached): its scale from current scaling or
    from `scales` (the (2, slots) scales and amaxes the recorder keeps on the device)."""
    if current:
        s, u = current_scale(t, fmt, margin)
    else:
        s, u = scales[0, slot], scales[1, slot]
    v = operand_stats(t, fmt, s, u, FULL)
    one = v.new_ones(1)
    return torch.cat([one, v, one * t.numel()])


class GradTap(torch.autograd.Function):
    """Identity on y; its backward puts the row of y's gradient into the gradient of `sink`."""

    @staticmethod
    def forward(ctx, y, sink, scales, slot, fmt, current, margin):
        ctx.slot, ctx.fmt, ctx.current, ctx.margin = slot, fmt, current, margin
        ctx.save_for_backward(scales)
        ctx.sink_shape = sink.shape
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        (scales,) = ctx.saved_tensors
        g2 = g.detach().reshape(-1, g.shape[-1])
        row = operand_row(g2, ctx.fmt, scales, ctx.slot, ctx.current, ctx.margin)
        n, width = ctx.sink_shape
        z = row.new_zeros
        d = torch.cat([z(ctx.slot, width), row.reshape(1, width), z(n - ctx.slot - 1, width)])
        return g, d, None, None, None, None, None

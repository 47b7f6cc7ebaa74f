"""Scaling recipes, as fp8-capture implements them (capture/src/recipe.rs, capture/src/config.rs):
which FP8 format each role gets and which scale its cast uses.

- `bf16`: no FP8; operands are rounded to BF16 (format "bf16", scale 1).
- `delayed`: Transformer Engine's DelayedScaling. Each quantized tensor (module, role) keeps the
  amaxes of its last H steps; the scale used at a step is ``(fp8_max / reduce(history)) / 2^margin``,
  reduce being `max` or `most_recent`, and 1.0 while the history is empty. The history is updated
  after each step with the largest amax the tensor's casts saw; a zero amax is skipped, as TE keeps
  the previous scale then.
- `current`: the scale comes from the tensor's own amax just before the cast (computed where the
  tensor lives; see `fp8scope.stats` and `fp8scope.torch.stats`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import fp8

KINDS = ("bf16", "delayed", "current")
FORMAT_POLICIES = ("hybrid", "e4m3")
AMAX_ALGOS = ("max", "most_recent")
QUANTIZED_ROLES = ("activation", "weight", "gradient")
#: The operands of each GEMM, in (A, B) order as fp8-capture casts them.
GEMM_OPERANDS = {"fprop": ("activation", "weight"), "dgrad": ("gradient", "weight"), "wgrad": ("gradient", "activation")}
#: The GEMM whose cast supplies a dumped role's FP8 bytes (the operand's own layout first).
BYTE_SOURCE = {"activation": "fprop", "weight": "fprop", "gradient": "dgrad"}
#: The GEMM whose result each result role is.
RESULT_OF = {"output": "fprop", "dgrad": "dgrad", "wgrad": "wgrad"}


class Recipe:
    """A scaling recipe and, for `delayed`, the amax history of every quantized tensor."""

    def __init__(self, kind: str = "delayed", *, format: str = "hybrid", amax_history: int = 1024,
                 amax_algo: str = "max", margin: int = 0):
        if kind not in KINDS:
            raise ValueError(f"recipe '{kind}' is not one of {', '.join(KINDS)}")
        if format not in FORMAT_POLICIES:
            raise ValueError(f"format '{format}' is not one of {', '.join(FORMAT_POLICIES)}")
        if amax_algo not in AMAX_ALGOS:
            raise ValueError(f"amax_algo '{amax_algo}' is not one of {', '.join(AMAX_ALGOS)}")
        if int(amax_history) < 1:
            raise ValueError(f"amax_history must be at least 1, not {amax_history}")
        self.kind, self.format, self.amax_algo = kind, format, amax_algo
        self.amax_history, self.margin = int(amax_history), int(margin)
        self._history: dict[tuple[str, str], deque] = {}

    @property
    def is_fp8(self) -> bool:
        return self.kind != "bf16"

    def format_for(self, role: str) -> str:
        """`e4m3`, `e5m2` or `bf16` for a quantized role."""
        if not self.is_fp8:
            return "bf16"
        return "e5m2" if (self.format == "hybrid" and role == "gradient") else "e4m3"

    def history_amax(self, module: str, role: str) -> float | None:
        h = self._history.get((module, role))
        if not h:
            return None
        return float(max(h)) if self.amax_algo == "max" else float(h[-1])

    def delayed_scale(self, module: str, role: str) -> tuple[float, float]:
        """(scale, amax_used) of a delayed-scaling cast this step: (1, 0) while the history is empty."""
        a = self.history_amax(module, role)
        if a is None:
            return 1.0, 0.0
        return fp8.scale_for_amax(self.format_for(role), a, self.margin), a

    def observe(self, amaxes: dict[tuple[str, str], float]) -> None:
        """Pushes this step's amax of each (module, role) into its history (delayed scaling only)."""
        if self.kind != "delayed":
            return
        for key, amax in amaxes.items():
            a = float(np.float32(amax))
            if a == 0.0 or not np.isfinite(a):
                continue
            h = self._history.setdefault(key, deque(maxlen=self.amax_history))
            h.append(a)

    def config(self) -> dict:
        """The `recipe` object of the manifest's config."""
        from .manifest import recipe_config

        return recipe_config(self.kind, format=self.format, amax_history=self.amax_history,
                             amax_algo=self.amax_algo, margin=self.margin)

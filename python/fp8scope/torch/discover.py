"""Finding the GEMM sites of a model: every `torch.nn.Linear` (torchao's `Float8Linear` is one) and
Transformer Engine's `Linear`, recognised by class without importing those libraries.

Transformer Engine's `LayerNormLinear` and `LayerNormMLP` are not recorded: the input of their GEMMs
is computed inside the module, where hooks cannot see it (the recorder names them in the run's notes).
"""

from __future__ import annotations

import re

import torch


def _classes(m) -> list[tuple[str, str]]:
    return [(c.__module__, c.__name__) for c in type(m).__mro__]


def linear_kind(m: torch.nn.Module) -> str | None:
    """What kind of GEMM site `m` is: "te" (Transformer Engine Linear), "torchao" (Float8Linear),
    "torch" (any other nn.Linear), or None."""
    classes = _classes(m)
    if any(mod.startswith("transformer_engine") and name == "Linear" for mod, name in classes):
        return "te"
    if isinstance(m, torch.nn.Linear):
        if any(mod.startswith("torchao") and name == "Float8Linear" for mod, name in classes):
            return "torchao"
        return "torch"
    return None


def unrecordable(m: torch.nn.Module) -> bool:
    """Transformer Engine modules that fuse a LayerNorm before their GEMMs."""
    return any(mod.startswith("transformer_engine") and name in ("LayerNormLinear", "LayerNormMLP")
               for mod, name in _classes(m))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module that `torch.compile` and `DistributedDataParallel` wrappers hold, so that module
    paths have no `_orig_mod.` or `module.` (FSDP2 and tensor parallelism change modules in place)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif any(c.__name__ == "DistributedDataParallel" for c in type(model).__mro__) and hasattr(model, "module"):
            model = model.module
        else:
            return model


def sites(model: torch.nn.Module, modules: str | None) -> tuple[list[tuple[str, torch.nn.Module, str]], list[str]]:
    """(path, module, kind) of every GEMM site whose path matches `modules` (re.search; all when
    None), in registration order; and the paths of the modules that cannot be recorded."""
    pat = re.compile(modules) if modules is not None else None
    found, skipped = [], []
    for path, m in unwrap(model).named_modules():
        if unrecordable(m):
            skipped.append(path)
            continue
        kind = linear_kind(m)
        if kind is not None and (pat is None or pat.search(path)):
            found.append((path, m, kind))
    return found, skipped

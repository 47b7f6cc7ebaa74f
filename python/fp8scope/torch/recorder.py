"""`Recorder`: records a PyTorch training loop into an fp8scope run directory.

For every GEMM site (see `discover`), hooks see the three GEMMs' operands with fp8-capture's roles:
fprop (activation X = the module's input, weight W), dgrad (gradient dY = the gradient arriving at the
module's output, weight) and wgrad (gradient, activation). Each operand's statistics are those of the
cast the recipe implies (fp8scope's saturating, round-to-nearest-even cast with the recipe's scale),
computed on the device into small float64 vectors; `step()` concatenates the step's vectors and
copies them to the host once (one device-to-host copy per step), then hands them to
`fp8scope.session.Session`, which writes the tables.

Hooks: two forward pre-hooks per site — one ahead of every other (X as the caller passed it, before
a tensor-parallel style turns it into a DTensor), one after every other (W as the forward uses it,
after FSDP2's all-gather) — a forward hook (output Y; non-finite outputs in execution order), a
tensor hook on Y for dY, and on the sites that are dumped a tensor hook on X for the dgrad dump (the
gradient arriving at the module's input) and a post-accumulate-grad hook on W for the wgrad dump.
Distributed tensors are measured by their local shard: every rank records its own.

In a job of several processes (torchrun, …) every rank records into the same run directory, its own
partition of each table (`fp8scope.torch.distributed`); torchao `Float8Linear` modules also have their
own casts recorded (`fp8scope.torch.casts`): the `casts` table, with the cast and forward-weight
audits.
Eager hooks only note their operands: the step's batch (`batch.py`) reduces them together at the end
of the backward pass and `step()` copies the results to the host once, asynchronously, read at the
next step. Under torch.compile the hooks are traced into the graph (`graph.py`: no graph break)
except at dump steps, whose hooks run eagerly. `batched=False` keeps the per-operand reference path
(each operand reduced in its hook, hooks excluded from compilation, a synchronous copy per step),
which writes the same tables bit for bit. Forwards run with gradients disabled (validation under
`torch.no_grad()`) and forwards inside `with rec.paused():` are not recorded.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import sys
import time
import warnings
import weakref

import numpy as np
import torch

from .. import manifest as mf
from .. import stats as st
from ..recipe import QUANTIZED_ROLES, Recipe
from ..session import CHEAP, FULL, Session, StepRecord
from . import batch as bt
from . import casts as ct
from . import discover
from . import distributed as dist_
from . import graph as gr
from .cast import MAX, cast_fp8, dequantize_fp8, round_bf16
from .stats import DEVICE_FIELDS, Kernels, _own_code, nonfinite_count, shadow_stats

_disable = getattr(getattr(torch, "_dynamo", None), "disable", lambda f: f)
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
#: Where amax sits in a device raw vector (every level's fields start the same way).
_AMAX = DEVICE_FIELDS[0].index("amax")


class Recorder:
    """Records the training loop of `model` into the run directory `out` (created; must not exist
    or be empty).

    Call `step(loss)` after each optimizer step and `close()` at the end (or use it as a context
    manager); an exception or Ctrl-C that leaves the `with` block, or reaches the top of the program,
    marks the run crashed with the error; a non-finite loss marks it diverged and stops recording.

    recipe: "delayed" (Transformer Engine's DelayedScaling: amax_history, amax_algo "max" or
        "most_recent", margin), "current" (scale from the tensor's own amax), or "bf16" (the baseline:
        statistics of BF16 casts). format: "hybrid" (E4M3 forward, E5M2 gradients) or "e4m3".
    stats_every / quant_error_every: statistics every N steps and at step 1; quant_mse / quant_cos
        every N statistics steps and at dump steps (fp8-capture's cadence).
    dump_every / dump_layers / dump_roles / dump_max_elems / dump_sample: tensor dumps (values and
        FP8 bytes) every N steps and at step 1, of the modules whose path matches dump_layers
        (re.search).
    shadow: at dump steps, each dumped module's three GEMMs are also computed in BF16 on the same
        inputs and compared with FP8: the module's own output for fprop when it is not a plain
        nn.Linear (a Transformer Engine, torchao or custom FP8 layer: its real casts, faults
        included), the recipe's emulated FP8 GEMM otherwise; the error goes to the shadow table.
    modules: a regex (re.search) over module paths choosing which sites to record (default all).
    fused: compile the statistics with torch.compile (True / False / "auto" = on CUDA).
    vocab, optimizer, steps: optional facts for the manifest (ln V; lr, betas, eps, weight decay; the
        planned number of steps). lr is read from the optimizer when `step` is not given one.
    batched: reduce a step's operands together at the end of its backward pass and read the results
        one step later (True), or each operand in its hook with a synchronous copy per step (False:
        the reference path; the tables are the same bit for bit). hold_bytes: operands held for the
        batch before it runs early.
    casts: record the casts torchao's Float8Linear modules make themselves (the `casts` table, with
        the audits) on statistics steps; False leaves torchao untouched.
    audit_every: the cast audit (the module's FP8 bytes against fp8scope's reference cast at the
        module's scale) runs at step 1, at dump steps and every `audit_every` steps (0: dump steps
        only), on statistics steps. The forward-weight audit runs at every statistics step.
    mesh, groups, amax_groups: how the job is split, for the manifest's `parallel`, when what the
        recorder finds (DDP, FSDP2, DTensor meshes) is not all: a DeviceMesh; {name: (kind, a
        ProcessGroup or [[ranks], …])} with kind dp / fsdp / tp / world / other; {role: [group names]}
        that the configuration reduces amaxes over.

    Under torch.distributed, constructing the Recorder is collective: every rank constructs one
    with the same `out`; rank 0 creates the run and every rank writes its own partition.
    """

    def __init__(self, model: torch.nn.Module, out: str, recipe: str = "delayed", *, format: str = "hybrid",
                 amax_history: int = 1024, amax_algo: str = "max", margin: int = 0, stats_every: int = 1,
                 quant_error_every: int = 10, dump_every: int = 0, dump_layers: str = ".*", dump_roles=mf.ROLES,
                 dump_max_elems: int = 4096, dump_sample: str = "first", shadow: bool = False, flush_every: int = 25,
                 modules: str | None = None, fused="auto", vocab: int | None = None, optimizer=None,
                 steps: int | None = None, notes=(), audit_every: int = 10, casts: bool = True, mesh=None,
                 groups=None, amax_groups=None, batched: bool = True, hold_bytes: int = 1 << 31):
        if int(audit_every) < 0:
            raise ValueError(f"fp8scope: audit_every must be 0 or more, not {audit_every}")
        found, skipped = discover.sites(model, modules)
        if not found:
            raise ValueError("fp8scope: no nn.Linear (or Transformer Engine Linear) in the model"
                             + (f" matches modules={modules!r}" if modules is not None else ""))
        self.paths = [p for p, _, _ in found]
        # Modules that run their own FP8 forward (any Linear but a plain nn.Linear). When the model
        # has some, its plain nn.Linear modules run in BF16 (an lm_head, a gate): no shadow GEMM
        # pretends they are FP8.
        self.own_fp8 = {p for p, m, _ in found if type(m) is not torch.nn.Linear}
        try:
            dump_re = re.compile(dump_layers)
        except re.error as e:
            raise ValueError(f"fp8scope: dump_layers: the regex {dump_layers!r} does not compile: {e}") from None
        self.dump_paths = {p for p in self.paths if dump_re.search(p)}
        if dump_every > 0 and not self.dump_paths:
            raise ValueError(f"fp8scope: dump_layers={dump_layers!r} matches none of the {len(self.paths)} recorded "
                             f"modules, e.g. {', '.join(self.paths[:8])}")
        param = next(model.parameters(), None)
        dev = ct.local(param).device if param is not None else torch.device("cpu")
        self.recipe = Recipe(recipe, format=format, amax_history=amax_history, amax_algo=amax_algo, margin=margin)
        kinds = sorted({k for _, _, k in found})
        note_list = [
            "statistics describe the cast the recipe implies for each operand (fp8scope's saturating, "
            "round-to-nearest-even cast and the recipe's scale), which is the model's own cast only if it "
            "casts that way",
            "dgrad dumps are the gradient arriving at the module's input",
            f"GEMM sites: {', '.join(kinds)} linear modules",
        ] + [f"not recorded (GEMM input inside the module): {p}" for p in skipped] + list(notes)
        layers = {st.layer_of(p) for p in self.paths if any(c.isdigit() for c in p.split("."))}
        train = {"steps": int(steps or 0)}
        if optimizer is not None:
            g = optimizer.param_groups[0]
            train.update(lr=float(g.get("lr", 0.0)), weight_decay=float(g.get("weight_decay", 0.0)),
                         eps=float(g.get("eps", 0.0)))
            if "betas" in g:
                train.update(beta1=float(g["betas"][0]), beta2=float(g["betas"][1]))
        self.optimizer = optimizer
        self.by_config = ct.torchao_configs(found) if casts else {}
        if self.by_config:
            note_list.append("casts: the torchao Float8Linear modules' own casts (scale, local and used amax, "
                             "digest of the FP8 bytes), the cast audit and the forward-weight audit")
        self.rank_ctx = dist_.context(model, mesh=mesh, groups=groups, amax_groups=amax_groups, kinds=kinds)
        self.rank = self.rank_ctx.rank

        def make_session(prepare: bool) -> Session:
            return Session(
                out, self.recipe, stats_every=stats_every, quant_error_every=quant_error_every, dump_every=dump_every,
                dump_layers=dump_layers, dump_roles=dump_roles, dump_max_elems=dump_max_elems, dump_sample=dump_sample,
                shadow=shadow, flush_every=flush_every, framework=f"torch {torch.__version__}",
                device=_device_info(dev), libraries=_libraries(),
                model={"layers": (max(layers) + 1) if layers else 0, "vocab": int(vocab or 0)}, train=train,
                ln_vocab=math.log(vocab) if vocab else 0.0, notes=note_list, rank_ctx=self.rank_ctx, prepare=prepare)

        self.session = dist_.start(self.rank_ctx, out, make_session)
        self.out = out
        self.audit_every = int(audit_every)
        self.modules = {p: m for p, m, _ in found}
        # Modules whose weight is gathered in FP8 (torchao's FSDP float8 all-gather): the forward's
        # weight is not the master's cast, so no forward-weight audit.
        self._no_master = {p for p, m, _ in found
                           if getattr(getattr(m, "config", None), "enable_fsdp_float8_all_gather", False)}
        self._masters: dict[str, torch.Tensor] = {}
        self._refresh_masters()
        self.kernels = Kernels(fused, dev.type)
        self.slots = {(p, r): i for i, (p, r) in enumerate((p, r) for p in self.paths for r in QUANTIZED_ROLES)}
        # Row 0 the scales, row 1 the amaxes they came from: (1, 0) while delayed scaling's history is empty.
        self._scale_host = np.stack([np.ones(len(self.slots)), np.zeros(len(self.slots))]).astype(np.float32)
        self._scale_dev: dict[torch.device, torch.Tensor] = {}
        self.batched, self.hold_bytes = bool(batched), int(hold_bytes)
        self._hist = None
        if self.batched and self.recipe.kind == "delayed":
            fmt_max = [MAX[self.recipe.format_for(r)] for (_, r) in self.slots]
            self._hist = bt.DeviceHistory(fmt_max, amax_history, amax_algo, margin, dev)
            self._scale_dev[dev] = self._hist.scales
        self._pending: list[tuple] = []  # (piece index, slot, format, level, tensor, its version, path, role)
        self._pending_bytes = 0
        self._amax_parts: list[tuple[list[int], torch.Tensor]] = []  # (slots, their amaxes) of this step's operands
        self._flush_queued = False
        self._inflight = None  # the previous step, on its way to the host
        # The compiled path (graph.py): forward rows, the gradient rows' sink, non-finite outputs.
        self._path_ix = {p: i for i, p in enumerate(self.paths)}
        self._gscales = self._scales(dev)
        self._gbuf = torch.zeros(len(self.slots), gr.ROW, dtype=torch.float64, device=dev)
        self._gout = torch.zeros(len(self.paths), dtype=torch.float64, device=dev)
        self._sink = torch.zeros(len(self.slots), gr.ROW, dtype=torch.float64, device=dev, requires_grad=True)
        # The recorder's own cost: host seconds in its hooks and step(), device milliseconds of its
        # batched work (CUDA events), step milliseconds, over the steps after the first.
        self._cost = {"host_s": 0.0, "step_host_s": 0.0, "device_ms": 0.0, "step_ms": 0.0, "steps": 0, "timed": False}
        self._events: list = []
        self._pieces: list[torch.Tensor] = []
        self._descs: list[tuple] = []  # (desc, number of pieces)
        self._wgrad_done: set[str] = set()
        self._fwd: dict[str, tuple] = {}  # per module in its forward: (raw X, X 2-D, its scale)
        self._fwd_recorded: set[str] = set()  # modules whose forward was recorded this step
        self._cast_seen: set[tuple[str, str]] = set()
        self._noted: set[str] = set()
        self._paused = 0
        self.step_no = 1
        self.plan = self.session.plan(1)
        self.closed = False
        self._t0 = time.perf_counter()
        self._handles = []
        for p, m, _ in found:
            self._handles.append(m.register_forward_pre_hook(self._hook(self._input_hook(p), self._g_input(p)), prepend=True))
            self._handles.append(m.register_forward_pre_hook(self._hook(self._weight_hook(p), self._g_weight(p))))
            self._handles.append(m.register_forward_hook(self._hook(self._forward_hook(p), self._g_forward(p))))
            w = getattr(m, "weight", None)
            if p in self.dump_paths and "wgrad" in self.session.dump_roles and isinstance(w, torch.nn.Parameter) \
                    and hasattr(w, "register_post_accumulate_grad_hook"):
                self._handles.append(w.register_post_accumulate_grad_hook(self._hook(self._wgrad_hook(p), None)))
        if self.by_config:
            ct.install(self)
        _live.add(self)
        _install_exit_hooks()

    # ---------------------------------------------------------------- hooks
    def _hook(self, eager, traced):
        """A hook as registered: while dynamo traces a compiled model, the traced form (`traced`,
        statistics inside the graph: no graph break) unless this step dumps, whose hooks need the
        tensors' values on the host side and run eagerly (the compiled model breaks its graph there);
        otherwise the eager form, its host time counted. The reference path (`batched=False`)
        always runs eagerly, excluded from compilation."""
        off = _disable(self._timed(eager))
        if not self.batched or traced is None:
            return off

        timed = self._timed(eager)

        def hook(*args):
            if _compiling():
                if not self.plan.dump:
                    return traced(*args)
                return off(*args)
            return timed(*args)
        # A code object of its own: where a graph break makes dynamo compile a hook as a frame of its
        # own, each hook keeps its own cache and recompile limit (one shared code object would hit
        # the limit and run every hook eagerly from then on, split from its module's other hooks).
        self._n_hooks = getattr(self, "_n_hooks", 0) + 1
        return _own_code(hook, ("fp8scope_hook", self._n_hooks))

    def _tensor_hook(self, fn):
        """A tensor hook registered during a step: excluded from compilation on the reference path
        (as before batching); as is when batched — wrapping costs ~0.3 ms per call to
        `torch._dynamo.disable`, and the eager backward never traces it."""
        return fn if self.batched else _disable(fn)

    def _timed(self, fn):
        def timed(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self._cost["host_s"] += time.perf_counter() - t
        return timed

    def _recording(self) -> bool:
        return not self.closed and not self._paused and torch.is_grad_enabled()

    def _add(self, desc: tuple, *pieces: torch.Tensor) -> None:
        self._descs.append((desc, len(pieces)))
        self._pieces.extend(pieces)

    def _note(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            self.session.notes.append(text)

    def _scales(self, device: torch.device) -> torch.Tensor:
        s = self._scale_dev.get(device)
        if s is None:
            s = self._scale_dev[device] = torch.from_numpy(self._scale_host.copy()).to(device)
        return s

    def _operand(self, path: str, role: str, t: torch.Tensor, level: int, need_scale: bool, keep: bool = True):
        """Queues the statistics of one operand; returns the scale of its cast (a 0-d device tensor),
        or None when they wait for the step's batch (`batched`, when the scale is not needed now and
        the tensor stays valid until the end of the backward pass: `keep`)."""
        fmt = self.recipe.format_for(role)
        slot = self.slots[(path, role)]
        if self.batched and not need_scale and keep:
            self._pending.append((len(self._pieces), slot, fmt, level, t, t._version, path, role))
            self._add(("operand", path, role, level, t.numel()), None)
            self._pending_bytes += t.numel() * t.element_size()
            if self._pending_bytes > self.hold_bytes:
                self._flush()
            return None
        if self.recipe.kind == "current" and (need_scale or level >= CHEAP):
            scale, used = self.kernels.current(t, fmt, self.recipe.margin)
        else:
            buf = self._scales(t.device)
            scale, used = buf[0, slot], buf[1, slot]
        v = self.kernels.operand(t, fmt, scale, used, level)
        self._add(("operand", path, role, level, t.numel()), v)
        if self._hist is not None:
            self._amax_parts.append(([slot], v[_AMAX:_AMAX + 1]))
        return scale

    def _flush(self) -> None:
        """The statistics of every operand waiting for the batch: one multi-tensor call per (format,
        level, device); operands that are the same tensor under a scale that does not depend on the
        slot (current scaling, bf16) are reduced once."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        ev = self._event_pair()
        groups: dict[tuple, list] = {}
        for e in pending:
            groups.setdefault((e[2], e[3], e[4].device), []).append(e)
        for (fmt, level, dev), es in groups.items():
            if fmt == "nonfinite":  # module outputs: their NaN and Inf counts
                out = self.kernels.nonfinite_many([e[4] for e in es])
                for r, e in enumerate(es):
                    self._pieces[e[0]] = out[r]
                continue
            current = self.recipe.kind == "current" and level >= CHEAP
            shared = self.recipe.kind != "delayed"
            uniq, row_of, keys = [], [], {}
            for e in es:
                t = e[4]
                if t._version != e[5]:
                    self._note(f"{e[6]}: its {e[7]} was changed in place before the end of the backward pass; "
                               "its statistics describe the changed tensor (batched=False measures it at once)")
                k = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype) if shared else None
                if k is None or k not in keys:
                    if k is not None:
                        keys[k] = len(uniq)
                    row_of.append(len(uniq))
                    uniq.append(e)
                else:
                    row_of.append(keys[k])
            out = self.kernels.many([e[4] for e in uniq], fmt, level, "current" if current else "fixed",
                                    self.recipe.margin, None if current else self._scales(dev), [e[1] for e in uniq])
            for e, r in zip(es, row_of):
                self._pieces[e[0]] = out[r]
            if self._hist is not None:
                rows = torch.tensor(row_of, device=out.device) if len(uniq) != len(es) else None
                col = out[:, _AMAX] if rows is None else out[rows, _AMAX]
                self._amax_parts.append(([e[1] for e in es], col))
        self._event_end(ev)

    def _end_backward(self) -> None:
        self._flush_queued = False
        t = time.perf_counter()
        self._flush()
        self._cost["host_s"] += time.perf_counter() - t

    def _queue_flush(self) -> None:
        """Reduces the waiting operands once the backward pass ends (before the optimizer changes
        the weights)."""
        if self._flush_queued or not self._pending:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self._flush_queued = True
        except RuntimeError:  # not inside a backward pass
            self._flush()

    def _event_pair(self):
        if self._gbuf.device.type != "cuda":
            return None
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def _event_end(self, start) -> None:
        if start is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._events.append((start, end))

    # ---- the compiled path: what the hooks do while dynamo traces them (see graph.py)
    def _g_row(self, path: str, role: str, t: torch.Tensor) -> torch.Tensor:
        return gr.operand_row(t, self.recipe.format_for(role), self._gscales, self.slots[(path, role)],
                              self.recipe.kind == "current", self.recipe.margin)

    def _g_input(self, path: str):
        def hook(module, args):
            if not self._recording() or not args or not isinstance(args[0], torch.Tensor):
                return
            xl = ct.local(args[0])
            if hasattr(xl, "_data") and hasattr(xl, "_scale"):
                return
            x2 = xl.detach().reshape(-1, xl.shape[-1])
            self._gbuf[self.slots[(path, "activation")]].add_(self._g_row(path, "activation", x2))
        return hook

    def _g_weight(self, path: str):
        def hook(module, args):
            if not self._recording():
                return
            wl = ct.local(module.weight).detach()
            self._gbuf[self.slots[(path, "weight")]].add_(self._g_row(path, "weight", wl))
        return hook

    def _g_forward(self, path: str):
        def hook(module, args, output):
            if not self._recording() or not isinstance(output, torch.Tensor):
                return None
            y = ct.local(output)
            self._gout[self._path_ix[path]].add_((~torch.isfinite(y.detach())).sum().double())
            if not output.requires_grad:
                return None
            return gr.GradTap.apply(output, self._sink, self._gscales, self.slots[(path, "gradient")],
                                    self.recipe.format_for("gradient"), self.recipe.kind == "current",
                                    self.recipe.margin)
        return hook

    def _dump(self, path: str, role: str, t: torch.Tensor, scale) -> None:
        if role not in self.session.dump_roles:
            return
        t = t.detach()
        cols = t.shape[-1] if t.dim() else 1
        rows = t.numel() // max(cols, 1)
        off, n, stride = st.dump_window(rows, cols, self.session.dump_max_elems, self.session.dump_strided)
        vals = t.reshape(-1)[off: off + n * stride: stride].float()
        fp8 = scale is not None and self.recipe.is_fp8 and role in QUANTIZED_ROLES
        if fp8:
            codes = cast_fp8(vals, self.recipe.format_for(role), scale)
            piece = torch.cat([scale.reshape(1).double(), vals.double(), codes.double()])
        else:
            piece = vals.double()
        self._add(("dump", path, role, (rows, cols), off, stride, vals.numel(), fp8), piece)

    def _emulated(self, t: torch.Tensor, role: str, scale) -> torch.Tensor:
        fmt = self.recipe.format_for(role)
        return dequantize_fp8(cast_fp8(t, fmt, scale), fmt, scale)

    def _shadow(self, path: str, gemm: str, a, ra, sa, b, rb, sb, bias=None, observed=None) -> None:
        """FP8 vs BF16 GEMM on the same inputs: fprop a·bᵀ, dgrad a·b, wgrad aᵀ·b. The FP8 side is
        `observed`, what the module itself computed, when given (a layer with its own FP8 forward:
        whatever its cast does, faults included, is then measured), else the recipe's emulation."""
        def mm(x, y):
            if gemm == "fprop":
                return x @ y.t()
            return x @ y if gemm == "dgrad" else x.t() @ y
        with _exact_f32_matmul():
            bb = 0.0 if bias is None else round_bf16(ct.local(bias).detach())
            if observed is not None:
                test = observed.detach().reshape(-1, observed.shape[-1]).float()
            else:
                test = round_bf16(mm(self._emulated(a, ra, sa), self._emulated(b, rb, sb)) + bb)
            ref = round_bf16(mm(round_bf16(a), round_bf16(b)) + bb)
        self._add(("shadow", path, gemm, test.numel()), shadow_stats(test, ref))

    def _input_hook(self, path: str):
        # Runs before every other pre-hook: X as the caller passed it (a tensor-parallel style has
        # not yet made it a DTensor of FP8).
        def hook(module, args):
            self._fwd.pop(path, None)
            if not self._recording() or not args or not isinstance(args[0], torch.Tensor):
                return
            x = args[0]
            xl = ct.local(x)
            if hasattr(xl, "_data") and hasattr(xl, "_scale"):  # already cast by the caller: no X to measure
                self._note(f"{path}: its input arrives already in FP8; its activation statistics are not recorded")
                return
            plan = self.plan
            dumped = plan.dump and path in self.dump_paths
            x2 = xl.detach().reshape(-1, xl.shape[-1])
            sx = self._operand(path, "activation", x2, plan.level, dumped)
            if dumped:
                self._dump(path, "activation", x2, sx)
            self._fwd[path] = (x, x2, sx)
            self._fwd_recorded.add(path)
        return hook

    def _weight_hook(self, path: str):
        # Runs after every other pre-hook: W as the forward uses it (FSDP2 has gathered it).
        def hook(module, args):
            if path not in self._fwd:
                return
            plan = self.plan
            dumped = plan.dump and path in self.dump_paths
            wl = ct.local(module.weight).detach()
            # A weight gathered for the forward (FSDP2) is freed after it: measured at once.
            keep = module.weight is self._masters.get(path)
            sw = self._operand(path, "weight", wl, plan.level, dumped, keep)
            if dumped:
                self._dump(path, "weight", wl, sw)
            x, x2, sx = self._fwd[path]
            # Kept only as long as the forward lasts (FSDP2 frees the gathered weight after it).
            w_shadow = wl.clone() if plan.shadow and dumped else None
            self._fwd[path] = (x, x2, sx, sw, w_shadow)
        return hook

    def _forward_hook(self, path: str):
        def hook(module, args, output):
            got = self._fwd.pop(path, None)
            if got is None or len(got) < 5 or not self._recording():
                return
            x, x2, sx, sw, w = got
            plan = self.plan
            y = output[0] if isinstance(output, (tuple, list)) else output
            yl = ct.local(y) if isinstance(y, torch.Tensor) else y
            dumped = plan.dump and path in self.dump_paths
            if self.batched and isinstance(yl, torch.Tensor):
                self._pending.append((len(self._pieces), None, "nonfinite", None, yl.detach(), yl._version, path, "output"))
                self._add(("output", path), None)
                self._pending_bytes += yl.numel() * yl.element_size()
            else:
                self._add(("output", path), nonfinite_count(yl))
            if dumped:
                self._dump(path, "output", yl, None)
                if x.requires_grad and "dgrad" in self.session.dump_roles:
                    x.register_hook(self._tensor_hook(self._dgrad_hook(path)))
            own = path in self.own_fp8 and isinstance(y, torch.Tensor)
            shadow = plan.shadow and dumped and (own or not self.own_fp8) and w is not None
            if shadow and _is_dtensor(module.weight):
                self._note(f"{path}: no shadow GEMMs for a module whose weight is a DTensor (its GEMM is split over ranks)")
                shadow = False
            if shadow:
                # A plain nn.Linear runs in the model's own precision: its FP8 side is the
                # recipe's emulation. Any other Linear (Transformer Engine's, torchao's, the
                # user's own FP8 layer) computed its FP8 output itself: measure that one.
                self._shadow(path, "fprop", x2, "activation", sx, w, "weight", sw,
                             getattr(module, "bias", None), observed=yl if own else None)
            if isinstance(y, torch.Tensor) and y.requires_grad:
                saved = (x2, w, sx, sw) if shadow else None
                y.register_hook(self._tensor_hook(self._timed(self._grad_hook(path, dumped, saved))))
        return hook

    def _grad_hook(self, path: str, dumped: bool, saved):
        def hook(g):
            if self.closed:
                return
            gl = ct.local(g)
            g2 = gl.detach().reshape(-1, gl.shape[-1])
            sg = self._operand(path, "gradient", g2, self.plan.level, dumped)
            self._queue_flush()
            if dumped:
                self._dump(path, "gradient", g2, sg)
            if saved is not None:
                x2, w, sx, sw = saved
                self._shadow(path, "dgrad", g2, "gradient", sg, w, "weight", sw)
                self._shadow(path, "wgrad", g2, "gradient", sg, x2, "activation", sx)
        return hook

    def _dgrad_hook(self, path: str):
        def hook(g):
            if not self.closed:
                gl = ct.local(g)
                self._dump(path, "dgrad", gl.detach().reshape(-1, gl.shape[-1]), None)
        return hook

    def _wgrad_hook(self, path: str):
        def hook(param):
            # Backward runs with gradients disabled: only closed and paused count here.
            if not self.closed and not self._paused and self.plan.dump and path not in self._wgrad_done \
                    and param.grad is not None:
                self._wgrad_done.add(path)
                self._dump(path, "wgrad", ct.local(param.grad), None)
        return hook

    # ---------------------------------------------------------------- the module's own casts
    def _audit_step(self) -> bool:
        s, e = self.plan.step, self.audit_every
        return self.plan.dump or (e > 0 and (s == 1 or s % e == 0))

    def wants_casts(self) -> bool:
        """Whether this step's casts are measured (a statistics step of an open, unpaused recording)."""
        return not self.closed and not self._paused and self.plan.level >= CHEAP

    def on_cast(self, path: str, role: str | None, hp, used_amax, out) -> None:
        """A cast torchao made for module `path` (see `fp8scope.torch.casts`): the first of each
        (module, role) in a recorded forward (or its backward) on a statistics step is measured."""
        if role is None or not self.wants_casts():
            return
        if role == "gradient":
            if path not in self._fwd_recorded:
                return
        elif path not in self._fwd:  # a forward that is not recorded (no_grad, paused)
            return
        if (path, role) in self._cast_seen:
            return
        self._cast_seen.add((path, role))
        if role == "gradient":
            m = self.modules[path]
            last = ct.local(hp).shape[-1] if getattr(hp, "dim", lambda: 0)() else None
            w = ct.local(m.weight)
            if last not in (w.shape[0], getattr(m, "out_features", None)):
                self._note(f"{path}: a gradient cast of {last} columns was not the module's (out {w.shape[0]}); skipped")
                return
        master = None
        if role == "weight" and path not in self._no_master:
            master = self._masters.get(path)
        got = ct.measure(hp, used_amax, out, role, audit=self._audit_step(), master=master)
        if got is None:
            self._note(f"{path}: a {role} cast that is not a tensorwise e4m3/e5m2 Float8 tensor is not recorded")
            return
        fmt, what, floats, ints = got
        self._add(("cast", path, role, fmt, what), floats, ints)

    def _refresh_masters(self) -> None:
        """Each site's master weight as the optimizer holds it, outside any forward (FSDP2 swaps the
        module's weight for the gathered one during its forward)."""
        for p, m in self.modules.items():
            w = getattr(m, "weight", None)
            if isinstance(w, torch.Tensor):
                self._masters[p] = w

    # ---------------------------------------------------------------- the step
    def step(self, loss, *, grad_norm=None, lr=None, tokens: int | None = None) -> None:
        """Ends a step: reduces its waiting operands, updates delayed scaling's history on the
        device, starts the copy of its statistics to the host (one copy, asynchronous on CUDA), and
        writes the rows of the step before it, whose copy has landed meanwhile (`batched`; the
        reference path copies and writes this step's at once). `loss` (and `grad_norm`) may be
        tensors; `lr` defaults to the optimizer's when one was given. A non-finite loss is seen
        when its step's rows are written: one step later when batched."""
        if self.closed:
            raise RuntimeError(f"fp8scope: the recording of {self.out} is closed")
        t_in = time.perf_counter()
        step_ms = (t_in - self._t0) * 1e3
        self._flush()
        ev = self._event_pair()
        descs, pieces = self._descs, self._pieces
        self._descs, self._pieces = [], []
        sink = self._sink.grad
        if self.batched:
            descs.append((("graph",), 3))
            pieces += [self._gbuf, self._gout, sink if sink is not None else torch.zeros_like(self._gbuf)]
        for name, v in (("loss", loss), ("grad_norm", grad_norm)):
            if isinstance(v, torch.Tensor):
                descs.append(((name,), 1))
                pieces.append(ct.local(v).detach().reshape(-1)[:1].double())
        if lr is None and self.optimizer is not None:
            lr = self.optimizer.param_groups[0].get("lr")
        if self._hist is not None:
            self._observe_amaxes(sink)
        meta = {"step": self.step_no, "plan": self.plan, "descs": descs, "loss": loss, "grad_norm": grad_norm,
                "lr": lr, "tokens": tokens, "step_ms": step_ms}
        if self.batched:
            copy = bt.HostCopy(pieces)
            self._gbuf.zero_()
            self._gout.zero_()
            self._sink.grad = None
            self._event_end(ev)
            meta["events"], self._events = self._events, []
            prev, self._inflight = self._inflight, None
            go_on = prev is None or self._end(prev[0], prev[1].values())
            if go_on:
                self._inflight = (meta, copy)
        else:
            meta["events"], self._events = [], []
            go_on = self._end(meta, _to_host(pieces))
        if not go_on:
            return
        self.step_no += 1
        self.plan = self.session.plan(self.step_no)
        self._wgrad_done = set()
        self._fwd.clear()
        self._fwd_recorded = set()
        self._cast_seen = set()
        self._refresh_masters()
        if self.recipe.kind == "delayed" and not self.batched:
            for (p, r), i in self.slots.items():
                self._scale_host[:, i] = self.recipe.delayed_scale(p, r)
            for d in list(self._scale_dev):
                src = torch.from_numpy(self._scale_host.copy())
                self._scale_dev[d] = src.pin_memory().to(d, non_blocking=True) if d.type == "cuda" else src.to(d)
        self._t0 = time.perf_counter()
        if self.step_no == 2:  # the cost is counted from the second step (the first compiles, dumps)
            self._cost["host_s"] = 0.0
            self._cost["timed"] = True
        else:
            self._cost["host_s"] += self._t0 - t_in

    def _observe_amaxes(self, sink) -> None:
        """Pushes this step's amax of every slot into the device history: the largest over its
        casts (eager operands, compiled rows seen once), 0 where it was not seen."""
        dev = self._gbuf.device
        a = torch.zeros(len(self.slots), dtype=torch.float64, device=dev)
        if self._amax_parts:
            idx = torch.tensor([s for sl, _ in self._amax_parts for s in sl], dtype=torch.int64)
            idx = idx.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else idx
            col = torch.cat([c.reshape(-1).to(dev) for _, c in self._amax_parts])
            a.scatter_reduce_(0, idx, col, "amax")
            self._amax_parts = []
        rows = self._gbuf if sink is None else self._gbuf + sink
        a = torch.maximum(a, torch.where(rows[:, 0] == 1, rows[:, 1 + _AMAX], torch.zeros_like(a)))
        self._hist.observe(a)

    def _end(self, meta: dict, values) -> bool:
        """Writes the rows of one step from its values on the host; False when its loss was not
        finite (the run is then marked diverged and recording stops)."""
        rec, got = self._observations(meta["descs"], values, meta["plan"])
        loss_v = got.get("loss", meta["loss"])
        gn = got.get("grad_norm", meta["grad_norm"])
        step = meta["step"]
        go_on = self.session.end_step(step, rec, loss=float(loss_v), step_ms=meta["step_ms"], grad_norm=gn,
                                      lr=meta["lr"], tokens=meta["tokens"], plan=meta["plan"])
        if step > 1:
            c = self._cost
            c["steps"] += 1
            c["step_ms"] += meta["step_ms"]
            c["device_ms"] += sum(s.elapsed_time(e) for s, e in meta["events"])
        if not go_on:
            self._stop()
            warnings.warn(f"fp8scope: non-finite loss at step {step}; the run {self.out} is marked diverged "
                          "and recording stopped", RuntimeWarning, stacklevel=3)
        return go_on

    def cost(self) -> dict | None:
        """The recorder's own cost so far, per step after the first: its host time (hooks and
        `step()`), the device time of its batched work (CUDA, eager hooks), the step time between
        `step()` calls, and `share` = (host + device) / step, an upper bound where host and device
        overlap. Statistics computed inside a compiled graph are in the step time, not in device_ms.
        None before two steps were recorded."""
        c = self._cost
        if not c["steps"]:
            return None
        n = c["steps"]
        step_ms, host_ms = c["step_ms"] / n, c["host_s"] * 1e3 / n
        dev_ms = c["device_ms"] / n if self._gbuf.device.type == "cuda" else None
        share = (host_ms + (dev_ms or 0.0)) / step_ms if step_ms > 0 else None
        return {"steps": n, "step_ms": step_ms, "host_ms": host_ms, "device_ms": dev_ms, "share": share,
                "batched": self.batched}

    def _raw(self, role: str, level: int, numel, v) -> np.ndarray:
        raw = np.full(len(st.RAW), np.nan)
        for name, x in zip(DEVICE_FIELDS[level], v):
            raw[st.IX[name]] = x
        raw[st.IX["numel"]] = numel
        raw[st.IX["inf"]] = numel - raw[st.IX["nan"]] - raw[st.IX["n_finite"]]
        if self.recipe.format_for(role) == "bf16":
            raw[st.IX["amax_used"]] = raw[st.IX["amax"]]
        return raw

    def _graph_observations(self, buf, out, sink, level: int) -> tuple[list, list]:
        """Forward and backward observations from the compiled path's rows (see graph.py), in the
        order of the modules' registration (the backward in reverse)."""
        n = len(DEVICE_FIELDS[level])
        buf, sink = buf.reshape(len(self.slots), gr.ROW), sink.reshape(len(self.slots), gr.ROW)
        fwd, bwd = [], []

        def row(path, role, rows):
            r = rows[self.slots[(path, role)]]
            if r[0] > 1:
                self._note(f"{path}: called more than once in a step inside a compiled graph: its {role} "
                           "statistics are not recorded there")
            return None if r[0] != 1 else ("operand", path, role, self._raw(role, level, r[-1], r[1:1 + n]))

        for path in self.paths:
            obs = [row(path, r, buf) for r in ("activation", "weight")]
            if buf[self.slots[(path, "activation")], 0] or buf[self.slots[(path, "weight")], 0]:
                fwd.append(("output", path, float(out[self._path_ix[path]])))
            fwd += [o for o in obs if o is not None]
        for path in reversed(self.paths):
            o = row(path, "gradient", sink)
            if o is not None:
                bwd.append(o)
        return fwd, bwd

    def _observations(self, descs, values, plan) -> tuple[StepRecord, dict]:
        rec, got = StepRecord(), {}
        at = 0
        g_fwd, g_bwd = [], []
        for d, n in descs:
            v = values[at]
            kind = d[0]
            if kind == "operand":
                _, path, role, level, numel = d
                rec.observations.append(("operand", path, role, self._raw(role, level, numel, v)))
            elif kind == "graph":
                g_fwd, g_bwd = self._graph_observations(v, values[at + 1], values[at + 2], plan.level)
            elif kind == "output":
                rec.observations.append(("output", d[1], float(v[0])))
            elif kind == "dump":
                _, path, role, shape, off, stride, n_el, fp8 = d
                if fp8:
                    scale, vals, codes = float(v[0]), v[1:1 + n_el].astype(np.float32), v[1 + n_el:].astype(np.uint8)
                else:
                    scale, vals, codes = None, v.astype(np.float32), None
                rec.observations.append(("dump", path, role, shape, off, stride, vals, codes, scale))
            elif kind == "shadow":
                rec.observations.append(("shadow", d[1], d[2], np.concatenate([[d[3]], v])))
            elif kind == "cast":
                _, path, role, fmt, what = d
                ints = values[at + 1]
                vals = {"scale": v[0], "amax_used": v[1], "amax_local": v[2]}
                for k in ("scale", "amax_used"):
                    if math.isnan(vals[k]):
                        vals[k] = None
                vals.update({name: int(x) for name, x in zip(what["ints"], ints)})
                for k in ("audit_checked", "master_checked"):
                    if k in what:
                        vals[k] = what[k]
                rec.observations.append(("cast", path, role, ct.FIRST_GEMM[role], "torchao", fmt, what["numel"], vals))
            else:
                got[kind] = float(v[0])
            at += n
        if g_fwd or g_bwd:
            rec.observations = g_fwd + rec.observations + g_bwd
        return rec, got

    # ---------------------------------------------------------------- the end
    @contextlib.contextmanager
    def paused(self):
        """Forwards and backwards inside this block are not recorded (e.g. evaluation with grads)."""
        self._paused += 1
        try:
            yield self
        finally:
            self._paused -= 1

    def _stop(self):
        self.closed = True
        ct.uninstall(self)
        for h in self._handles:
            h.remove()
        self._handles = []
        self._descs, self._pieces = [], []
        self._pending, self._amax_parts, self._inflight = [], [], None
        _live.discard(self)

    def close(self, status: str = "completed", error: str | None = None) -> None:
        """Finishes the run (a step begun but not ended by `step()` is dropped): writes the last
        step's rows, the recorder's cost (the manifest's `recorder_cost`, and one line on stderr)."""
        if self.closed:
            return
        prev, self._inflight = self._inflight, None
        if prev is not None and not self._end(prev[0], prev[1].values()):
            return
        self._stop()
        cost = self.cost()
        if cost is not None and cost["share"] is not None:
            self.session.writer.update_manifest({"recorder_cost": cost})
            dev = "" if cost["device_ms"] is None else f" + device {cost['device_ms']:.2f} ms"
            who = f" (rank {self.rank})" if self.rank_ctx.world_size > 1 else ""
            print(f"fp8scope: the recorder took {100 * cost['share']:.1f}% of the step time{who}: host "
                  f"{cost['host_ms']:.2f} ms{dev} of {cost['step_ms']:.2f} ms a step over {cost['steps']} steps "
                  f"({self.out})", file=sys.stderr, flush=True)
        self.session.finish(status, error)

    def crash(self, exc: BaseException) -> None:
        """Marks the run crashed by `exc` (what leaving the `with` block with an exception does)."""
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "crashed"
        msg = f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")
        self.close("crashed", f"{msg} (after step {self.step_no - 1})")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            self.crash(exc)
        else:
            self.close()
        return False


class _exact_f32_matmul(contextlib.ContextDecorator):
    """float32 matmuls without TF32 inside the block (the shadow GEMMs' reference precision)."""

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        return self

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.saved
        return False


def _is_dtensor(t) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "placements")


def _to_host(pieces: list[torch.Tensor]) -> list[np.ndarray]:
    """Every piece on the host: one concatenation and one copy per device and dtype (float64, and the
    casts' int64 digests and counts)."""
    out: list[np.ndarray | None] = [None] * len(pieces)
    by_dev: dict[tuple, list[int]] = {}
    for i, p in enumerate(pieces):
        by_dev.setdefault((p.device, p.dtype), []).append(i)
    for idx in by_dev.values():
        flat = torch.cat([pieces[i].reshape(-1) for i in idx]).cpu().numpy()
        at = 0
        for i in idx:
            n = pieces[i].numel()
            out[i] = flat[at: at + n]
            at += n
    return out


def _device_info(dev: torch.device) -> dict:
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return {"kind": "cuda", "name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                "parallelism": p.multi_processor_count, "block_gemm": None}
    import platform

    return {"kind": dev.type, "name": platform.processor() or platform.machine(), "compute_capability": None,
            "parallelism": os.cpu_count() or 1, "block_gemm": None}


def _libraries() -> dict:
    libs = {"torch": torch.__version__}
    if torch.version.cuda:
        libs["cuda"] = torch.version.cuda
    for name in ("transformer_engine", "torchao"):
        mod = sys.modules.get(name)
        if mod is not None:
            libs[name] = str(getattr(mod, "__version__", "?"))
    return libs


# ---- runs left open when the program ends: crashed by an uncaught exception, else completed.
_live: "weakref.WeakSet[Recorder]" = weakref.WeakSet()
_installed = False


def _install_exit_hooks():
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def excepthook(t, v, tb):
        for rec in list(_live):
            rec.crash(v)
        previous(t, v, tb)

    def at_exit():
        for rec in list(_live):
            rec.session.notes.append("closed at interpreter exit without Recorder.close()")
            rec.close()

    sys.excepthook = excepthook
    atexit.register(at_exit)

"""One recording, host side: what to measure at each step (`plan`), the scales of delayed scaling, and
turning what a step measured — raw statistic vectors, non-finite counts, dumps, shadow GEMMs, the
module's own casts, in execution order — into the rows of the steps, stats, tensors, events, shadow
and casts tables, as fp8-capture's training loop does (capture/src/train.rs,
capture/src/record/rows.rs). Every row carries the recording's `rank`.

It knows nothing of torch: `fp8scope.torch.Recorder` measures on the device and hands numpy values
to `end_step`; the tests hand it numpy reference statistics.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from . import manifest as mf
from . import stats as st
from .ranks import RankContext, job_note
from .recipe import BYTE_SOURCE, GEMM_OPERANDS, QUANTIZED_ROLES, RESULT_OF, Recipe
from .writer import RunWriter

#: Measurement levels of a step (capture's StatsLevel): amaxes only (delayed scaling's history and
#: non-finite checks), cheap statistics, and the quantization error as well.
AMAX, CHEAP, FULL = 0, 1, 2
DUMP_SAMPLES = ("first", "strided")


@dataclass
class Plan:
    """What one step measures."""

    step: int
    level: int
    dump: bool
    shadow: bool


@dataclass
class StepRecord:
    """What one step measured, in execution order. Each observation is a tuple:
    ("operand", module, role, raw vector), ("output", module, non-finite count),
    ("dump", module, role, shape, offset, stride, values f32, fp8 codes or None, scale or None),
    ("shadow", module, gemm, shadow raw vector),
    ("cast", module, role, gemm, source, format, numel, values) — one cast the module made itself;
    `values` holds scale, amax_local, amax_used, digest, and where audits ran audit_checked,
    audit_mismatched, master_checked, master_mismatched and master_digest (the digest of this rank's
    master weight as the reference casts it)."""

    observations: list = field(default_factory=list)


class Session:
    """The host side of one recording into `out`."""

    def __init__(self, out: str, recipe: Recipe, *, stats_every: int = 1, quant_error_every: int = 10,
                 dump_every: int = 0, dump_layers: str = ".*", dump_roles=mf.ROLES, dump_max_elems: int = 4096,
                 dump_sample: str = "first", shadow: bool = False, flush_every: int = 25, framework: str = "",
                 device: dict | None = None, libraries: dict | None = None, model: dict | None = None,
                 train: dict | None = None, ln_vocab: float = 0.0, notes=(), threaded: bool = True,
                 rank_ctx: RankContext | None = None, prepare: bool = True):
        for name, v in (("stats_every", stats_every), ("quant_error_every", quant_error_every), ("dump_every", dump_every)):
            if int(v) < 0:
                raise ValueError(f"{name} must be 0 or more, not {v}")
        if int(flush_every) < 1:
            raise ValueError(f"flush_every must be at least 1, not {flush_every}")
        if int(dump_max_elems) < 1:
            raise ValueError(f"dump_max_elems must be at least 1, not {dump_max_elems}")
        if dump_sample not in DUMP_SAMPLES:
            raise ValueError(f"dump_sample '{dump_sample}' is not one of {', '.join(DUMP_SAMPLES)}")
        bad = [r for r in dump_roles if r not in mf.ROLES]
        if bad:
            raise ValueError(f"dump_roles: {bad} not roles ({', '.join(mf.ROLES)})")
        try:
            self.dump_re = re.compile(dump_layers)
        except re.error as e:
            raise ValueError(f"dump_layers: the regex '{dump_layers}' does not compile: {e}") from None
        self.recipe = recipe
        self.stats_every, self.quant_error_every, self.dump_every = int(stats_every), int(quant_error_every), int(dump_every)
        self.dump_roles, self.dump_max_elems, self.dump_strided = tuple(dump_roles), int(dump_max_elems), dump_sample == "strided"
        self.shadow, self.flush_every = bool(shadow) and recipe.is_fp8, int(flush_every)
        self.framework, self.notes = framework, list(notes)
        self.modules: list[str] = []  # in the order first seen
        self.losses: list[float] = []
        self.steps_done = 0
        self.given = {"grad_norm": False, "lr": False, "tokens": False}
        self.closed = False
        record = mf.record_config(stats_every=self.stats_every, quant_error_every=self.quant_error_every,
                                  dump_every=self.dump_every, dump_layers=dump_layers, dump_roles=self.dump_roles,
                                  dump_max_elems=self.dump_max_elems, dump_sample=dump_sample, shadow=self.shadow,
                                  flush_every=self.flush_every)
        dev = device or {"kind": "cpu", "name": "cpu", "compute_capability": None, "parallelism": os.cpu_count() or 1,
                         "block_gemm": None}
        self.train = dict(train or {})
        self.config = mf.external_config(recipe=recipe.config(), record=record, device=dev["kind"], model=model,
                                         train=self.train)
        ctx = rank_ctx or RankContext()
        self.rank, self.world_size = int(ctx.rank), int(ctx.world_size)
        if ctx.job_id is not None:
            self.notes.append(job_note(ctx.job_id))
        self.notes += list(ctx.notes)
        self._last_digest: dict[tuple[str, str], tuple] = {}
        if self.rank == 0 and prepare:
            mf.prepare_new_run_dir(out)
        self.out = out
        m = mf.new_running(name=os.path.basename(os.path.normpath(out)), config=self.config, device=dev,
                           origin=self._origin(), libraries=libraries, ln_vocab=ln_vocab,
                           world_size=self.world_size, parallel=ctx.parallel, ranks=ctx.ranks)
        self.writer = RunWriter(out, m, rank=self.rank, world_size=self.world_size,
                                ranks_from_liveness=ctx.job_id is not None, threaded=threaded)

    # ---- what to measure
    def plan(self, step: int) -> Plan:
        """capture's plan_step: statistics every `stats_every` steps and at step 1, dumps every
        `dump_every` steps and at step 1, the quantization error at step 1, every
        stats_every·quant_error_every steps and at dump steps."""
        se, de, qe = self.stats_every, self.dump_every, self.quant_error_every
        stats_step = se > 0 and (step % se == 0 or step == 1)
        dump_step = de > 0 and (step % de == 0 or step == 1)
        full = dump_step or (stats_step and qe > 0 and (step == 1 or step % (se * qe) == 0))
        level = FULL if (full and stats_step) else CHEAP if stats_step else AMAX
        return Plan(step=step, level=level, dump=dump_step, shadow=dump_step and self.shadow)

    def dumps_module(self, module: str) -> bool:
        return bool(self.dump_re.search(module))

    def scale(self, module: str, role: str) -> tuple[float, float]:
        """(scale, amax_used) of a delayed-scaling cast of this tensor at the current step."""
        return self.recipe.delayed_scale(module, role)

    # ---- a step's rows
    def _lacks(self) -> list[str]:
        lacks = []
        if self.dump_every == 0:
            lacks.append("dumps")
        if not self.shadow:
            lacks.append("shadow")
        if self.stats_every == 0:
            lacks.append("stats")
        lacks += [k for k, v in self.given.items() if not v]
        return lacks

    def _origin(self) -> dict:
        return mf.origin(framework=self.framework, modules=self.modules, lacks=self._lacks(), notes=self.notes)

    def end_step(self, step: int, rec: StepRecord, *, loss: float, step_ms: float, grad_norm: float | None = None,
                 lr: float | None = None, tokens: int | None = None, plan: Plan | None = None) -> bool:
        """Records one step. Returns False when the loss is not finite: the step is recorded in full,
        the run is marked diverged and closed, as fp8-capture stops there."""
        if self.closed:
            raise RuntimeError("fp8scope: the recording is closed")
        plan = plan or self.plan(step)
        loss = float(loss)
        new_modules = False
        merged: dict[tuple[str, str], list] = {}
        outputs: dict[str, float] = {}
        order: list[str] = []
        for ob in rec.observations:
            if ob[0] in ("operand", "output"):
                module = ob[1]
                if module not in order:
                    order.append(module)
                if module not in self.modules:
                    self.modules.append(module)
                    new_modules = True
            if ob[0] == "operand":
                merged.setdefault((ob[1], ob[2]), []).append(ob[3])
            elif ob[0] == "output":
                outputs[ob[1]] = outputs.get(ob[1], 0.0) + float(ob[2])
        raws = {k: st.merge(v) for k, v in merged.items()}
        gemms = self._gemms_that_ran(order, raws)

        rows = {"steps": [], "stats": [], "tensors": [], "events": [], "shadow": [], "casts": []}
        if plan.level >= CHEAP:
            for module, gemm in gemms:
                for role in GEMM_OPERANDS[gemm]:
                    rows["stats"].append(st.stat_row(step, st.layer_of(module), module, gemm, role,
                                                     self.recipe.format_for(role), raws[(module, role)]))
        rows["events"] = self._events(step, rec, gemms)
        nonfinite = sum(1 for module, gemm in gemms for role in GEMM_OPERANDS[gemm] if _nonfinite(raws[(module, role)]))
        nonfinite += sum(1 for v in outputs.values() if v > 0)
        for ob in rec.observations:
            if ob[0] == "dump":
                rows["tensors"].append(self._tensor_row(step, *ob[1:]))
            elif ob[0] == "shadow":
                rows["shadow"].append(st.shadow_row(step, st.layer_of(ob[1]), ob[1], ob[2], ob[3]))
            elif ob[0] == "cast" and plan.level >= CHEAP:
                rows["casts"].append(self._cast_row(step, *ob[1:]))
        for k, v in (("grad_norm", grad_norm), ("lr", lr), ("tokens", tokens)):
            self.given[k] |= v is not None
        rows["steps"].append({
            "step": step, "loss": loss, "grad_norm": math.nan if grad_norm is None else float(grad_norm),
            "lr": math.nan if lr is None else float(lr), "tokens": 0 if tokens is None else int(tokens),
            "step_ms": float(step_ms), "loss_is_finite": math.isfinite(loss), "nonfinite_tensors": int(nonfinite),
        })
        finite = math.isfinite(loss)
        if not finite:
            rows["events"].append({"step": step, "kind": "nonfinite_loss", "value": loss,
                                   "message": f"loss is {loss} at step {step}; recording stopped"})
        self.recipe.observe({k: v[st.IX["amax"]] for k, v in raws.items()
                             if k[1] in QUANTIZED_ROLES and not math.isnan(v[st.IX["amax"]])})
        for table_rows in rows.values():
            for r in table_rows:
                r["rank"] = self.rank
        self.writer.add(rows)
        if new_modules or step == 1:
            self.writer.update_manifest({"origin": self._origin()})
        self.losses.append(loss)
        self.steps_done = step
        if not finite:
            self.finish("diverged", f"non-finite loss at step {step}")
            return False
        if step % self.flush_every == 0:
            self.writer.flush(step)
        return True

    def _gemms_that_ran(self, order: list[str], raws: dict) -> list[tuple[str, str]]:
        """(module, gemm) whose operands were all seen this step: fprop in forward order, then dgrad
        and wgrad from the last module back to the first (the order backward runs them)."""
        out = [(m, "fprop") for m in order if all((m, r) in raws for r in GEMM_OPERANDS["fprop"])]
        for m in reversed(order):
            for g in ("dgrad", "wgrad"):
                if all((m, r) in raws for r in GEMM_OPERANDS[g]):
                    out.append((m, g))
        return out

    def _events(self, step: int, rec: StepRecord, gemms) -> list[dict]:
        """`nonfinite_tensor` events in execution order: each operand with a NaN or Inf (once, with
        the first GEMM that casts it) and each module output with one."""
        ran = set(gemms)
        events = []
        for ob in rec.observations:
            if ob[0] == "operand":
                _, module, role, raw = ob
                if not _nonfinite(raw):
                    continue
                gemm = next((g for g in ("fprop", "dgrad", "wgrad") if role in GEMM_OPERANDS[g] and (module, g) in ran),
                            "fprop" if role != "gradient" else "dgrad")
                nan, inf = int(raw[st.IX["nan"]]), int(raw[st.IX["inf"]])
                events.append(_event(step, module, gemm, role, nan + inf,
                                     f"{nan} nan and {inf} inf in {module}.{role} (operand of {module}.{gemm})"))
            elif ob[0] == "output" and ob[2] > 0:
                n = int(ob[2])
                events.append(_event(step, ob[1], "fprop", "output", n,
                                     f"{n} non-finite values in {ob[1]}.output (result of {ob[1]}.fprop)"))
        return events

    def _tensor_row(self, step, module, role, shape, offset, stride, values, codes, scale) -> dict:
        rows_, cols = shape
        row = {"step": step, "layer": st.layer_of(module), "module": module, "role": role, "gemm": None,
               "format": None, "shape": [int(rows_), int(cols)], "numel": int(rows_) * int(cols),
               "offset": int(offset), "stride": int(stride), "values": np.asarray(values, np.float32)}
        if codes is not None:
            row.update(gemm=BYTE_SOURCE[role], format=self.recipe.format_for(role),
                       fp8=np.asarray(codes, np.uint8).tobytes(), scale=float(np.float32(scale)))
        return row

    def _cast_row(self, step, module, role, gemm, source, fmt, numel, v) -> dict:
        """A `casts` row; master_changed / forward_changed compare the digests with this rank's
        previous recorded step of the same operand (null at its first)."""
        def f(k):
            x = v.get(k)
            return None if x is None else float(x)

        def i(k):
            x = v.get(k)
            return None if x is None else int(x)

        row = {"step": step, "layer": st.layer_of(module), "module": module, "gemm": gemm, "role": role,
               "source": source, "format": fmt, "scale": f("scale"), "amax_local": f("amax_local"),
               "amax_used": f("amax_used"), "numel": None if numel is None else int(numel), "digest": i("digest"),
               "audit_checked": i("audit_checked"), "audit_mismatched": i("audit_mismatched"),
               "master_checked": i("master_checked"), "master_mismatched": i("master_mismatched")}
        prev = self._last_digest.get((module, role))
        now = (row["digest"], i("master_digest"))
        if prev is not None and role == "weight":
            row["forward_changed"] = None if None in (prev[0], now[0]) else prev[0] != now[0]
            row["master_changed"] = None if None in (prev[1], now[1]) else prev[1] != now[1]
        self._last_digest[(module, role)] = now
        return row

    # ---- the end
    def finish(self, status: str, error: str | None = None) -> dict | None:
        """Closes every table and writes the final manifest (once; later calls do nothing)."""
        if self.closed:
            return None
        self.closed = True
        config = copy.deepcopy(self.config)
        config["train"]["steps"] = max(int(config["train"].get("steps") or 0), self.steps_done)
        self.writer.update_manifest({"origin": self._origin(), "config": config})
        return self.writer.finish(status, self.steps_done, self.losses, error)


def _nonfinite(raw) -> bool:
    return raw[st.IX["nan"]] + raw[st.IX["inf"]] > 0


def _event(step, module, gemm, role, count, message) -> dict:
    return {"step": step, "kind": "nonfinite_tensor", "layer": st.layer_of(module), "module": module, "gemm": gemm,
            "role": role, "value": float(count), "message": message}

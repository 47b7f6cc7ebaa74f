"""The module's own FP8 casts: what torchao's `Float8Linear` actually fed its GEMMs, per rank.

torchao casts every operand through one function, `hp_tensor_and_scale_to_float8(hp, scale, dtype,
linear_mm_config, gemm_input_role)` (torchao/float8/float8_training_tensor.py): the forward's input
and weight (float8_linear.py, and the tensor-parallel styles' input in float8_tensor_parallel.py),
the backward's gradient (the matmul's backward, or `NoopFwToFloat8BwDynamic` under tensor
parallelism), and FSDP2's float8 all-gather (fsdp_utils.py). `install` wraps that function in every
torchao module that holds it, and `amax_to_scale` (float8_utils.py) so that the amax a dynamic
scale came from is seen exactly. Each call is attributed to its module by the `linear_mm_config` it
carries (each Float8Linear has its own object, which autograd's saved context keeps for the
backward), and to its role by `gemm_input_role`: INPUT → activation, WEIGHT → weight, GRAD_OUTPUT →
gradient. The first cast of each (module, role) in a step is the one recorded (the forward's input
and weight feed fprop; the backward's first gradient cast feeds dgrad); torchao's later casts of the
same tensor in the backward give the same bytes under tensorwise scaling.

Per cast, on the device and on this rank's local tensors (a DTensor's local shard): the scale, the
local amax, the amax used, a digest of the FP8 bytes; on audit steps the bytes re-quantized by
fp8scope's reference cast at the module's scale (`cast.cast_fp8`); for the weight, this rank's master
weight (its shard) quantized the same way against the rows of the forward's weight it holds.

Casts inside a `torch.compile`d region are not observed: observing them would break the graph around
the very kernels the audit is meant to check.
"""

from __future__ import annotations

import inspect
import sys

import torch

from .cast import MAX, cast_fp8

#: Digest weights repeat every DIGEST_MOD elements: Σ byte·(i mod DIGEST_MOD + 1), mod 2^63.
DIGEST_MOD = 65521
DIGEST_MASK = (1 << 63) - 1
ROLES = {"INPUT": "activation", "WEIGHT": "weight", "GRAD_OUTPUT": "gradient"}
#: The GEMM each role's first cast of a step feeds.
FIRST_GEMM = {"activation": "fprop", "weight": "fprop", "gradient": "dgrad"}
FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}

_disable = getattr(getattr(torch, "_dynamo", None), "disable", lambda f: f)
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

_taps: list = []  # the live CastTaps, each a recorder's
_saved: dict = {}  # name → (original function, our wrapper)
_last_amax: dict = {}  # the last amax_to_scale call: {"scale": its result, "amax": its argument}


# ------------------------------------------------------------------ local views of distributed tensors
def local(t):
    """This rank's own tensor: a DTensor's local shard, an AsyncCollectiveTensor's result."""
    if hasattr(t, "to_local") and hasattr(t, "placements"):
        t = t.to_local()
    wait = getattr(t, "trigger_wait", None)
    if wait is not None and type(t).__name__ == "AsyncCollectiveTensor":
        t = wait()
    return t


def region(t, shape2d: tuple[int, int]) -> tuple[int, int] | None:
    """(row, col) offset in the global tensor of this rank's local part of `t` (2-D), (0, 0) for a
    plain tensor; None where it cannot be told."""
    if not (hasattr(t, "device_mesh") and hasattr(t, "placements")):
        return (0, 0)
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, off = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return (int(off[0]), int(off[1])) if len(off) == 2 and tuple(shape) == tuple(shape2d) else None
    except Exception:  # noqa: BLE001 - a layout this torch cannot map: no master check
        return None


# ------------------------------------------------------------------ device reductions
def digest(codes: torch.Tensor) -> torch.Tensor:
    """Σ byte·(i mod 65521 + 1) over `codes` (uint8, row-major), mod 2^63, as a 0-d int64 tensor on
    the device: column sums of a (k, 65521) view, then one weighted sum (no n-element index tensor)."""
    flat = codes.reshape(-1)
    n = flat.numel()
    k = n // DIGEST_MOD
    w = torch.arange(1, DIGEST_MOD + 1, device=flat.device, dtype=torch.int64)
    main = (flat[: k * DIGEST_MOD].view(k, DIGEST_MOD).sum(0, dtype=torch.int64) * w).sum()
    tail = (flat[k * DIGEST_MOD:].to(torch.int64) * w[: n - k * DIGEST_MOD]).sum()
    return (main + tail) & DIGEST_MASK


def nan_codes(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """Which FP8 codes are NaN (E4M3: S.1111.111; E5M2: exponent all ones, mantissa not zero)."""
    if fmt == "e4m3":
        return (codes & 0x7F) == 0x7F
    return ((codes & 0x7C) == 0x7C) & ((codes & 0x03) != 0)


def mismatches(a: torch.Tensor, b: torch.Tensor, fmt: str) -> torch.Tensor:
    """Codes that differ, NaN against NaN counting as equal; 0-d int64."""
    return ((a != b) & ~(nan_codes(a, fmt) & nan_codes(b, fmt))).sum(dtype=torch.int64)


def abs_max(x: torch.Tensor) -> torch.Tensor:
    """max |x| as float64 (NaN propagates, as torchao's amax does)."""
    return x.abs().amax().double()


def reuse_amax(hp, used_amax, used) -> bool:
    """Whether the amax torchao computed for a cast is this rank's own max |x|: a plain tensor (not
    a DTensor's shard) in a process that reduces nothing across ranks (no process group of more
    than one rank), and a float32/bfloat16/float16 input whose max torch computed exactly."""
    if used is None or used_amax is None or hasattr(hp, "placements") or hasattr(used_amax, "placements"):
        return False
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return False
    return hp.dtype in (torch.float32, torch.bfloat16, torch.float16)


def audit_count(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """The cast audit: bytes of `codes` that differ from fp8scope's reference cast of x at `scale`."""
    return mismatches(cast_fp8(x, fmt, scale), codes, fmt)


def reference_and_digest(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8scope's reference cast of x at `scale`, and its digest."""
    ref = cast_fp8(x, fmt, scale)
    return ref, digest(ref)


def row_major_codes(codes: torch.Tensor, role: str) -> tuple[torch.Tensor, bool]:
    """The FP8 codes in the operand's row-major order, and whether they were transposed to get it: a
    weight in its own (out, in) layout (torchao casts `weight.t()`, whose bytes keep the weight's
    memory order), any other operand as is."""
    if role == "weight" and codes.dim() == 2 and codes.shape[0] > 1 and codes.stride() == (1, codes.shape[0]):
        return codes.t(), True
    return codes.contiguous(), False


# ------------------------------------------------------------------ the wrappers
def _wrap_cast(orig):
    params = list(inspect.signature(orig).parameters.values())
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def hp_tensor_and_scale_to_float8(*args, **kwargs):
        out = orig(*args, **kwargs)
        if _taps and not _compiling():
            a = dict(defaults)
            a.update(zip(names, args))
            a.update(kwargs)
            _observe(a.get(names[0]), a.get(names[1]), a.get("linear_mm_config"), a.get("gemm_input_role"), out)
        return out

    hp_tensor_and_scale_to_float8.__wrapped__ = orig
    hp_tensor_and_scale_to_float8._fp8scope = True
    return hp_tensor_and_scale_to_float8


def _replicated(amax):
    """A DTensor amax that is still a partial max (a sharded tensor's local maxima), reduced now: the
    same all-reduce DTensor runs inside amax_to_scale's division, done first so that the amax the
    scale came from is seen (torchao's scale and bytes are unchanged)."""
    placements = getattr(amax, "placements", None)
    if not placements or not any(getattr(p, "is_partial", lambda: False)() for p in placements):
        return amax
    from torch.distributed.tensor import Replicate

    return amax.redistribute(placements=[Replicate() if p.is_partial() else p for p in placements])


def _wrap_amax(orig):
    def amax_to_scale(amax, *args, **kwargs):
        if _taps and not _compiling() and any(t.wants_casts() for t in _taps):
            amax = _replicated(amax)
            scale = orig(amax, *args, **kwargs)
            _last_amax["scale"], _last_amax["amax"] = scale, amax
            return scale
        return orig(amax, *args, **kwargs)

    amax_to_scale.__wrapped__ = orig
    amax_to_scale._fp8scope = True
    return amax_to_scale


@_disable
def _observe(hp, scale_arg, cfg, role, out):
    name = getattr(role, "name", None)
    for tap in list(_taps):
        path = tap.by_config.get(id(cfg))
        if path is not None:
            used = _last_amax.get("amax") if _last_amax.get("scale") is scale_arg else None
            tap.on_cast(path, ROLES.get(name), hp, used, out)
            return


def _patch(attr: str, make) -> None:
    import torchao.float8.float8_training_tensor  # noqa: F401 - the modules that hold the functions
    import torchao.float8.float8_utils  # noqa: F401

    home = {"hp_tensor_and_scale_to_float8": "torchao.float8.float8_training_tensor",
            "amax_to_scale": "torchao.float8.float8_utils"}[attr]
    orig = getattr(sys.modules[home], attr)
    if getattr(orig, "_fp8scope", False):
        return
    wrapper = make(orig)
    _saved[attr] = (orig, wrapper)
    for name, mod in list(sys.modules.items()):
        if name.startswith("torchao") and mod is not None and getattr(mod, attr, None) is orig:
            setattr(mod, attr, wrapper)


def _unpatch(attr: str) -> None:
    if attr not in _saved:
        return
    orig, wrapper = _saved.pop(attr)
    for name, mod in list(sys.modules.items()):
        if name.startswith("torchao") and mod is not None and getattr(mod, attr, None) is wrapper:
            setattr(mod, attr, orig)


def install(tap) -> None:
    """Starts observing torchao's casts for `tap` (the first tap wraps the functions)."""
    if not _taps:
        _patch("hp_tensor_and_scale_to_float8", _wrap_cast)
        _patch("amax_to_scale", _wrap_amax)
    _taps.append(tap)


def uninstall(tap) -> None:
    """Stops observing for `tap`; the last one restores torchao's functions."""
    if tap in _taps:
        _taps.remove(tap)
    if not _taps:
        _unpatch("hp_tensor_and_scale_to_float8")
        _unpatch("amax_to_scale")
        _last_amax.clear()


def torchao_configs(sites) -> dict[int, str]:
    """id(linear_mm_config) → module path, for the torchao Float8Linear sites among `sites`."""
    out = {}
    for path, m, kind in sites:
        cfg = getattr(m, "linear_mm_config", None)
        if kind == "torchao" and cfg is not None:
            out[id(cfg)] = path
    return out


# ------------------------------------------------------------------ one cast, measured
def measure(hp, used_amax, out, role: str, *, audit: bool, master=None):
    """The device measurements of one cast: (format, what, floats, ints), where floats is a float64
    vector [scale, amax_used, amax_local], ints an int64 vector of the names in `what["ints"]`
    (digest; audit_mismatched; master_mismatched, master_digest) and `what` also gives the
    host-known counts (numel, audit_checked, master_checked). None when the cast is not an e4m3 /
    e5m2 Float8 tensor. The device functions run eagerly (a few small kernels per cast)."""
    f8 = local(out)
    data, scale = getattr(f8, "_data", None), getattr(f8, "_scale", None)
    if data is None or scale is None or data.dtype not in FORMATS:
        return None
    fmt = FORMATS[data.dtype]
    x = local(hp).detach()
    codes = data.view(torch.uint8)
    dev = codes.device
    scalar = scale.numel() == 1
    sf = (scale.detach().reshape(()) if scalar else scale.detach()).float()
    used = None
    if used_amax is not None:
        u = local(used_amax)
        partial = any(getattr(p, "is_partial", lambda: False)() for p in getattr(used_amax, "placements", ()))
        if u.numel() == 1 and not partial:
            used = u.detach().double().reshape(()).to(dev)
    nan = torch.full((), float("nan"), dtype=torch.float64, device=dev)
    if scalar:
        scale_v = sf.double()
        if used is None:
            used = MAX[fmt] / scale_v
    else:
        used, scale_v = nan, nan
    if reuse_amax(hp, used_amax, used):
        # torchao computed max |x| of this very tensor for its scale (tensor_to_amax, NaN included):
        # read it instead of a second pass over x.
        amax_local = used
    else:
        amax_local = abs_max(x) if x.numel() else torch.zeros((), dtype=torch.float64, device=dev)
    floats = torch.stack([scale_v, used, amax_local.to(dev)])
    rm, transposed = row_major_codes(codes, role)
    ints = [digest(rm)]
    what = {"numel": int(x.numel()), "ints": ["digest"]}
    m = None
    if master is not None and scalar and role == "weight":
        m = _master_check(hp, rm, transposed, master, fmt, sf)
    if audit:
        if m is not None and m[3]:  # the master is the very tensor cast: its check is the audit
            ints.append(m[1])
        else:
            ints.append(audit_count(x, codes, sf, fmt))
        what["ints"].append("audit_mismatched")
        what["audit_checked"] = int(x.numel())
    if m is not None:
        checked, mism, mdig, _ = m
        ints += [mism, mdig]
        what["ints"] += ["master_mismatched", "master_digest"]
        what["master_checked"] = checked
    return fmt, what, floats, torch.stack([v.to(dev) for v in ints])


def _master_check(hp, fw, transposed, master, fmt, sf):
    """(elements compared, mismatched 0-d, master digest 0-d, whether the master is the tensor cast):
    the forward's weight codes `fw` (the module's (out, in) weight) against this rank's master weight
    (its shard) quantized at the module's scale, over the rows and columns both hold."""
    if fw.dim() != 2:
        return None
    # torchao casts weight.t(): the forward's weight, in the weight's own coordinates, is hp.t().
    fo = region(hp.t() if transposed else hp, tuple(fw.shape))
    ml = local(master).detach()
    if ml.dim() != 2:
        return None
    mo = region(master, tuple(ml.shape))
    if fo is None or mo is None:
        return None
    r0, r1 = max(fo[0], mo[0]), min(fo[0] + fw.shape[0], mo[0] + ml.shape[0])
    c0, c1 = max(fo[1], mo[1]), min(fo[1] + fw.shape[1], mo[1] + ml.shape[1])
    mq, mdig = reference_and_digest(ml, sf, fmt)
    if r1 <= r0 or c1 <= c0:
        return 0, torch.zeros((), dtype=torch.int64, device=fw.device), mdig, False
    a = fw[r0 - fo[0]: r1 - fo[0], c0 - fo[1]: c1 - fo[1]]
    b = mq[r0 - mo[0]: r1 - mo[0], c0 - mo[1]: c1 - mo[1]].to(a.device)
    hl = local(hp)
    same = (ml.data_ptr() == hl.data_ptr() and ml.numel() == hl.numel() == a.numel())
    return (r1 - r0) * (c1 - c0), mismatches(b, a, fmt), mdig, same

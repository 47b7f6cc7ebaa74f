"""Where a recording stands in a job of several processes: its rank, the job's ranks, how the model
is split over them (the manifest's `parallel`), and how the ranks agree on one run directory.

With `torch.distributed` initialized, the Recorder's construction is collective: every rank's facts
are gathered with `all_gather_object`, rank 0 prepares the directory and writes `run.json`, and its
verdict is broadcast so that every rank raises the same error when the directory already holds a run.
Without a process group but under a launcher that says WORLD_SIZE > 1, the ranks meet through the
filesystem (`fp8scope.ranks.wait_for_run`). A plain process is rank 0 of 1.

What is found (`parallel`):
- `DistributedDataParallel` → a `dp` group (the process group it reduces over), wrapper `DDP`;
- FSDP2 (`fully_shard`: `FSDPModule` in a module's class hierarchy) → wrapper `FSDP2`, and the mesh
  dimension it shards over is an `fsdp` group;
- DTensor parameters → wrapper `DTensor`, their device mesh (the root mesh of a sub-mesh) and one
  group per mesh dimension, its kind from its name: `*tp*` → tp, `*dp_shard*` / `*fsdp*` → fsdp,
  `*dp*` / `*replicate*` → dp, else other (an unnamed dimension: fsdp under FSDP2, tp otherwise);
- `mesh=` (a DeviceMesh) and `groups=` ({name: (kind, ProcessGroup or [[ranks], …])}) given to the
  Recorder add to or replace what was found.
Each rank sees its own instance of a group; the gathered instances of all ranks make `members`.
"""

from __future__ import annotations

import os

import torch

from .. import ranks as rk

GROUP_KINDS = ("dp", "fsdp", "tp", "world", "other")


def _dist():
    d = getattr(torch, "distributed", None)
    return d if d is not None and d.is_available() else None


def initialized() -> bool:
    d = _dist()
    return d is not None and d.is_initialized()


def env_rank_world() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as a launcher sets them (0, 1 when none does)."""
    env = os.environ
    rank = env.get("RANK") or env.get("OMPI_COMM_WORLD_RANK") or env.get("SLURM_PROCID") or "0"
    world = env.get("WORLD_SIZE") or env.get("OMPI_COMM_WORLD_SIZE") or env.get("SLURM_NTASKS") or "1"
    return int(rank), int(world)


def launcher() -> str:
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "mpirun"
    if "SLURM_PROCID" in env:
        return "slurm"
    return "unknown"


def kind_of_dim(name: str | None, fsdp_dim: bool) -> str:
    """The group kind of a mesh dimension named `name`."""
    if fsdp_dim:
        return "fsdp"
    n = (name or "").lower()
    if not n:
        return "tp"
    if "tp" in n:
        return "tp"
    if "dp_shard" in n or "fsdp" in n:
        return "fsdp"
    if "dp" in n or "replicate" in n:
        return "dp"
    return "other"


def _classes(m) -> list[str]:
    return [c.__name__ for c in type(m).__mro__]


def _root_mesh(mesh):
    for get in (lambda m: m._get_root_mesh(),
                lambda m: __import__("torch.distributed.device_mesh", fromlist=["_mesh_resources"])
                ._mesh_resources.get_root_mesh(m)):
        try:
            root = get(mesh)
            if root is not None:
                return root
        except Exception:  # noqa: BLE001 - private API of another torch version
            continue
    return mesh


def _dim_names(mesh) -> list[str | None]:
    names = getattr(mesh, "mesh_dim_names", None)
    return list(names) if names else [None] * mesh.mesh.dim()


def _same_mesh(a, b) -> bool:
    return a is b or (torch.equal(a.mesh, b.mesh) and _dim_names(a) == _dim_names(b))


def _fsdp_meshes(model) -> list:
    """(mesh, shard dim) FSDP2 shards over, from its states (private API; empty where it changed)."""
    out = []
    for m in model.modules():
        if "FSDPModule" not in _classes(m):
            continue
        try:
            info = m._get_fsdp_state()._fsdp_param_group.mesh_info
            out.append((info.mesh, int(getattr(info, "shard_mesh_dim", 0))))
        except Exception:  # noqa: BLE001
            continue
    return out


def describe(model, *, mesh=None, groups=None, amax_groups=None, kinds=()) -> tuple[dict, list, list[str]]:
    """This rank's view of the job: (facts to gather, its groups as (name, kind, its instance),
    notes). `kinds` are the GEMM site kinds found (torchao, te, torch)."""
    d = _dist()
    notes = []
    wrappers = []
    inner = model
    seen_compile = False
    while True:
        if hasattr(inner, "_orig_mod"):
            seen_compile, inner = True, inner._orig_mod
        elif "DistributedDataParallel" in _classes(inner) and hasattr(inner, "module"):
            wrappers.append("DDP")
            ddp = inner
            inner = inner.module
        else:
            break
    my_groups: list[tuple[str, str, list[int]]] = []
    if "DDP" in wrappers and initialized():
        pg = getattr(ddp, "process_group", None)
        my_groups.append(("dp", "dp", sorted(d.get_process_group_ranks(pg) if pg is not None else range(d.get_world_size()))))
    fsdp = _fsdp_meshes(inner)
    if any("FSDPModule" in _classes(m) for m in inner.modules()):
        wrappers.append("FSDP2")
    meshes = []
    if any(hasattr(p, "device_mesh") and hasattr(p, "placements") for p in inner.parameters()):
        wrappers.append("DTensor")
    for p in inner.parameters():
        pm = getattr(p, "device_mesh", None)
        if pm is not None and hasattr(p, "placements"):
            meshes.append(pm)
    meshes += [m for m, _ in fsdp]
    if mesh is not None:
        meshes.insert(0, mesh)
    if "torchao" in kinds:
        wrappers.append("Float8Linear")
    if "te" in kinds:
        wrappers.append("TransformerEngine")
    if seen_compile:
        wrappers.append("torch.compile")
    # The mesh: the root of the given or found meshes (the first one when several roots differ).
    roots = []
    for m in meshes:
        r = _root_mesh(m)
        if not any(_same_mesh(r, x) for x in roots):
            roots.append(r)
    mesh_desc = None
    # The mesh dimensions FSDP2 shards over: by name, or (unnamed) by their root mesh and index.
    fsdp_names, fsdp_unnamed = set(), []
    for fm, dim in fsdp:
        names = _dim_names(fm)
        if dim < len(names) and names[dim]:
            fsdp_names.add(names[dim])
        else:
            fsdp_unnamed.append((_root_mesh(fm), dim))
    rank = d.get_rank() if initialized() else env_rank_world()[0]
    for j, m in enumerate(roots):
        names = []
        for i, n in enumerate(_dim_names(m)):
            kind = kind_of_dim(n, n in fsdp_names if n else any(_same_mesh(m, fm) and i == d for fm, d in fsdp_unnamed))
            if not n:
                n = {"fsdp": "dp_shard", "tp": "tp"}.get(kind, f"dim{i}")
                notes.append(f"mesh dimension {i} has no name; taken as {kind} and named {n}")
            names.append(n)
            along = m.mesh.movedim(i, -1).reshape(-1, m.mesh.shape[i])
            mine = [row for row in along.tolist() if rank in row]
            if mine:
                my_groups.append((n, kind, [int(r) for r in mine[0]]))
        if j == 0:
            mesh_desc = {"dim_names": names, "shape": [int(x) for x in m.mesh.shape],
                         "ranks": [int(r) for r in m.mesh.flatten().tolist()]}
    if len(roots) > 1:
        notes.append(f"{len(roots)} device meshes found; the manifest's mesh is the first")
    if groups:
        for name, spec in dict(groups).items():
            kind, members = spec
            if kind not in GROUP_KINDS:
                raise ValueError(f"fp8scope: groups[{name!r}]: kind {kind!r} is not one of {', '.join(GROUP_KINDS)}")
            my_groups = [g for g in my_groups if g[0] != name]
            if isinstance(members, (list, tuple)):
                for inst in members:
                    my_groups.append((name, kind, sorted(int(r) for r in inst)))
            else:
                my_groups.append((name, kind, sorted(d.get_process_group_ranks(members))))
    if amax_groups is not None:
        amax_groups = {str(k): [str(x) for x in v] for k, v in dict(amax_groups).items()}
    facts = {"wrappers": wrappers, "mesh": mesh_desc, "amax_groups": amax_groups,
             "backend": d.get_backend() if initialized() else None}
    return facts, my_groups, notes


def merge_groups(views: list[list[tuple[str, str, list[int]]]]) -> list[dict]:
    """The groups of every rank's view, each with every instance once, instances by first rank."""
    by_name: dict[str, dict] = {}
    for view in views:
        for name, kind, inst in view:
            g = by_name.setdefault(name, {"name": name, "kind": kind, "members": []})
            if list(inst) not in g["members"]:
                g["members"].append(list(inst))
    for g in by_name.values():
        g["members"].sort()
    return list(by_name.values())


def device_name(model) -> str:
    p = next(iter(model.parameters()), None)
    if p is None:
        return "cpu"
    p = p.to_local() if hasattr(p, "to_local") and hasattr(p, "placements") else p
    dev = p.device
    return f"{dev.type}:{dev.index}" if dev.index is not None else dev.type


def context(model, *, mesh=None, groups=None, amax_groups=None, kinds=()) -> rk.RankContext:
    """This process's RankContext. Collective when torch.distributed is initialized (every rank must
    construct its Recorder)."""
    d = _dist()
    env_rank, env_world = env_rank_world()
    local_rank = os.environ.get("LOCAL_RANK")
    me = {"rank": env_rank, "local_rank": int(local_rank) if local_rank is not None else None,
          "host": rk.host_name(), "pid": os.getpid(), "device": device_name(model)}
    facts, my_groups, notes = describe(model, mesh=mesh, groups=groups, amax_groups=amax_groups, kinds=kinds)
    if initialized():
        rank, world = d.get_rank(), d.get_world_size()
        me["rank"] = rank
        if world <= 1:
            return rk.RankContext(rank=0, world_size=1, me=me, notes=notes)
        gathered = [None] * world
        d.all_gather_object(gathered, (me, my_groups))
        parallel = {"launcher": launcher(), "backend": facts["backend"], "mesh": facts["mesh"],
                    "groups": merge_groups([g for _, g in gathered]), "wrappers": facts["wrappers"],
                    "amax_groups": facts["amax_groups"]}
        return rk.RankContext(rank=rank, world_size=world, parallel=parallel, ranks=[m for m, _ in gathered], me=me,
                              notes=notes)
    if env_world <= 1:
        return rk.RankContext(rank=0, world_size=1, me=me, notes=notes)
    job = rk.env_job_id()
    if job is None:
        raise RuntimeError("fp8scope: WORLD_SIZE > 1 but torch.distributed is not initialized and no launcher variables "
                           "(TORCHELASTIC_RUN_ID, SLURM_JOB_ID, MASTER_ADDR/MASTER_PORT) name the job: initialize the "
                           "process group before creating the Recorder")
    parallel = {"launcher": launcher(), "backend": None, "mesh": facts["mesh"],
                "groups": merge_groups([my_groups]), "wrappers": facts["wrappers"], "amax_groups": facts["amax_groups"]}
    notes.append("torch.distributed was not initialized when the Recorder started: the ranks met through the "
                 "filesystem, and the groups are those this rank saw")
    return rk.RankContext(rank=env_rank, world_size=env_world, parallel=parallel, ranks=[me] if env_rank == 0 else [],
                          me=me, job_id=job, notes=notes)


def start(ctx: rk.RankContext, out: str, make_session):
    """Runs `make_session(prepare)` on every rank so that rank 0 prepares `out` first: with a process
    group, rank 0 makes its session and broadcasts how that went, and the others follow or raise the
    same error; without one, the others wait for rank 0's run.json (`ranks.wait_for_run`)."""
    if ctx.single:
        return make_session(True)
    if ctx.job_id is None:
        d = _dist()
        verdict = [None]
        session = None
        if ctx.rank == 0:
            try:
                session = make_session(True)
            except BaseException as e:  # noqa: BLE001 - told to every rank, then raised here
                verdict[0] = (type(e).__name__, str(e))
                d.broadcast_object_list(verdict, src=0)
                raise
        d.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            kind, msg = verdict[0]
            err = {"FileExistsError": FileExistsError, "ValueError": ValueError, "PermissionError": PermissionError,
                   "NotADirectoryError": NotADirectoryError}.get(kind, RuntimeError)
            raise err(msg)
        return session if ctx.rank == 0 else make_session(False)
    if ctx.rank == 0:
        return make_session(True)
    rk.wait_for_run(out, ctx.rank, ctx.job_id)
    return make_session(False)

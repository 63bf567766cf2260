"""``sv.capture``: the plan the user's own sharding code makes, read back from torch's FSDP state.

The user's function runs, unchanged, on a meta copy of their model under torch's fake process
group (``oracle.meta_copy``, ``oracle.fake_process_group``). Code written for a GPU cluster runs on
this CPU machine because a few names are patched for the duration of the call and restored after
(``_cluster_on_cpu``): a ``"cuda"`` device mesh is built on ``"cpu"``, ``torch.cuda.current_device``
/ ``set_device`` / ``device_count`` answer for one rank of the world given, ``model.to("cuda")``
leaves meta tensors on meta (dtype casts still happen), and ``dist.init_process_group`` /
``destroy_process_group`` leave the fake group alone. ``dist.get_world_size()`` / ``get_rank()``
answer from the fake group itself.

Then the plan is read from torch's own record on the sharded copy: each ``FSDPState`` (its
modules: one call, grouped or not), its ``FSDPParamGroup`` (reshard after forward, the
``MixedPrecisionPolicy``, the offload policy), the prefetch lists ``set_modules_to_*_prefetch``
wrote, every ``checkpoint_wrapper`` (its policy where shardviz knows it, its name where not). The
parameters each call was told to ignore are recorded where torch takes them
(``_fully_shard._get_modules_and_states``), with the line of the user's code that made the call.

When the function raises, the plan so far comes back with the error as a finding (SV301) naming
the line of the user's code, and the release that refuses it where that can be told.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..checkpointing import FULL, SELECTIVE, CheckpointPolicy
from ..finding import Finding
from ..run.mesh import Mesh
from ..fsdp import parse_version
from ..export.oracle import device_mesh, fake_process_group, meta_copy
from ..plan import Origin, Plan, Unit

#: Module-name segments wrappers insert (``checkpoint_wrapper``, ``torch.compile``): a captured name drops them.
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod")
#: Where a traceback frame is someone else's code, not the user's line: torch's and shardviz's own
#: package folders and contextlib, by where they are installed (a folder of the user's that happens to
#: be named "shardviz" or "torch", such as a clone of this repository, is the user's code).
_LIBRARY_PARTS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
                  os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, os.path.abspath(contextlib.__file__))


def strip_wrappers(fqn: str) -> str:
    return ".".join(p for p in fqn.split(".") if p not in WRAPPER_SEGMENTS)


def user_line(frames, library=_LIBRARY_PARTS) -> str:
    """``file:line: code`` of the innermost frame that is not torch's or shardviz's ('' if none):
    ``library``, the paths such frames start with."""
    for frame in reversed(list(frames)):
        if not frame.filename.startswith(library):
            code = (frame.line or "").strip()
            return f"{os.path.basename(frame.filename)}:{frame.lineno}" + (f" ({code})" if code else "")
    return ""


@dataclass
class _Call:
    """One ``fully_shard`` call as torch took it: its modules, ignored parameters, the user's line."""

    modules: list
    ignored: set
    site: str


@dataclass
class Capture:
    """What one run of the user's function left behind; ``plan()`` turns it into an ``sv.Plan``."""

    root: nn.Module
    module_names: dict  # id(module of the copy, before the function ran) -> FQN in the user's model
    param_names: dict  # id(parameter of the copy, before) -> FQN
    calls: list = field(default_factory=list)
    error: Finding | None = None
    library: tuple = _LIBRARY_PARTS
    cast: tuple | None = None  # trainable parameters the function turned from a low precision to float32 (FQNs)

    def name_of(self, module: nn.Module, names: dict) -> str:
        return self.module_names.get(id(module), names.get(id(module), "?"))

    def plan(self, origin: Origin, findings=()) -> Plan:
        from torch.distributed.fsdp import fully_shard

        names = {id(m): strip_wrappers(f) for f, m in self.root.named_modules(remove_duplicate=False)}
        units, sites, states, empty = [], [], [], []
        for call in self.calls:
            state = fully_shard.state(call.modules[0]) if _has_state(call.modules[0]) else None
            if state is None or any(state is s for s in states):
                continue
            states.append(state)
            modules = [self.name_of(m, names) for m in state._modules]
            taken = {m for u in units for m in u.modules}
            if state._fsdp_param_group is None and any(m in taken for m in modules):
                empty.append((modules, call.site))  # a wrapper's call after its module's: it manages nothing
                continue
            units.append(_unit(state, modules))
            sites.append((units[-1].name, call.site))
        ignored = [self.param_names[id(p)] for call in self.calls for p in call.ignored if id(p) in self.param_names]
        checkpoint, unknown = _checkpoints(self.root, names, self)
        found = list(findings) + ([self.error] if self.error else [])
        found += [Finding("SV302", "info", f"{m!r} is checkpointed with {policy!r}, a policy shardviz does not "
                          "model: priced as full activation checkpointing", (m,)) for m, policy in unknown]
        if empty:
            found.append(Finding(
                "SV308", "info", f"{len(empty)} fully_shard calls on a checkpoint wrapper whose module already has "
                f"its own call (first at {empty[0][1]}): they manage no parameter and cost nothing; the plan keeps "
                "the module's call", tuple(m for mods, _ in empty for m in mods)[:3]))
        origin = Origin(origin.kind, origin.source, origin.release, tuple(found), origin.fixes, tuple(sites),
                        tuple(unknown))
        return Plan(units, ignored, origin.label, checkpoint, prefetch=_prefetch(states, self, names), origin=origin)


def _has_state(module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _unit(state, modules: list[str]) -> Unit:
    """One call read from torch: ``reshard_after_forward`` from the group's post-forward mesh, the
    group's ``MixedPrecisionPolicy`` and offload policy."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    group = state._fsdp_param_group
    mp = group.mp_policy if group is not None else state._mp_policy
    reshard = None
    if group is not None and not state._auto_reshard_after_forward:
        post = group.post_forward_mesh_info
        if post is None:
            reshard = False
        elif post.shard_mesh_size == group.mesh_info.shard_mesh_size:
            reshard = True
        else:
            reshard = int(post.shard_mesh_size)
    offload = group is not None and isinstance(group.offload_policy, CPUOffloadPolicy)
    return Unit(modules, reshard, _dtype_name(mp.param_dtype), _dtype_name(mp.reduce_dtype), offload)


def checkpoint_policy(wrapper) -> CheckpointPolicy | str:
    """``FULL``, ``SELECTIVE`` (shardviz's exported policy) or the name of the policy torch was given."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import OffloadWrapper

    from ..export_runtime import _selective_checkpoint_context

    if isinstance(wrapper, OffloadWrapper):
        return "offload_wrapper (activations saved on the host)"
    fn = getattr(wrapper, "checkpoint_fn", None)
    context_fn = getattr(fn, "keywords", {}).get("context_fn")
    if context_fn is None or getattr(context_fn, "__name__", "") == "noop_context_fn":
        return FULL
    if context_fn is _selective_checkpoint_context:
        return SELECTIVE
    inner = getattr(context_fn, "func", context_fn)
    return getattr(inner, "__qualname__", type(inner).__name__)


def _checkpoints(root: nn.Module, names: dict, cap: Capture):
    """{module: policy} for every checkpoint wrapper (outermost wins) and [(module, name)] of policies
    shardviz does not model, priced as "full"."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    policies, unknown = {}, []
    for fqn, module in root.named_modules():
        if not isinstance(module, ActivationWrapper):
            continue
        name = cap.name_of(module._checkpoint_wrapped_module, names)
        if name in policies or any(name.startswith(p + ".") for p in policies if p):
            continue
        policy = checkpoint_policy(module)
        if not isinstance(policy, CheckpointPolicy):
            unknown.append((name, policy))
            policy = FULL
        policies[name] = policy
    return policies, unknown


def _prefetch(states, cap: Capture, names: dict) -> dict:
    out = {}
    for state in states:
        me = cap.name_of(state._modules[0], names)
        for direction, targets in (("forward", state._states_to_forward_prefetch),
                                   ("backward", state._states_to_backward_prefetch)):
            if targets:
                out.setdefault(me, {})[direction] = [cap.name_of(s._modules[0], names) for s in targets]
    return out


# ---------------------------------------------------------------------------
# Running the user's function: the copy, the fake group, the patches
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _patched(*triples):
    """Set ``owner.name = value`` for each triple, and put every original back afterwards."""
    saved = [(owner, name, owner.__dict__.get(name, getattr(owner, name))) for owner, name, _ in triples]
    try:
        for owner, name, value in triples:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _meta_stays_meta(original):
    """``Tensor.to`` / ``.cuda``: a meta tensor asked onto a device stays on meta (a dtype change still happens)."""
    def to(self, *args, **kwargs):
        if not self.is_meta:
            return original(self, *args, **kwargs)
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if original.__name__ == "cuda" or (device is not None and device.type != "meta"):
            return self if dtype is None or dtype == self.dtype else original(self, dtype)
        return original(self, *args, **kwargs)

    to.__name__ = original.__name__
    return to


def _cluster_on_cpu(world: int, rank: int, cap: Capture):
    """The patches that let code written for a GPU cluster run here; see the module docstring."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard import _fully_shard

    mesh_init = DeviceMesh.__init__

    def on_cpu(self, device_type, *args, **kwargs):
        mesh_init(self, "cpu" if device_type != "cpu" else device_type, *args, **kwargs)

    take = _fully_shard._get_modules_and_states

    def recorded(module, device, ignored_params):
        out = take(module, device, ignored_params)
        cap.calls.append(_Call(list(out[1]), set(ignored_params or ()), user_line(traceback.extract_stack(), cap.library)))
        return out

    return _patched(
        (DeviceMesh, "__init__", on_cpu),
        (_fully_shard, "_get_modules_and_states", recorded),
        (torch.Tensor, "to", _meta_stays_meta(torch.Tensor.to)),
        (torch.Tensor, "cuda", _meta_stays_meta(torch.Tensor.cuda)),
        (torch.cuda, "current_device", lambda: rank % max(1, min(world, 8))),
        (torch.cuda, "set_device", lambda device: None),
        (torch.cuda, "device_count", lambda: max(1, min(world, 8))),
        (dist, "init_process_group", lambda *a, **k: None),
        (dist, "destroy_process_group", lambda *a, **k: None),
    )


@contextlib.contextmanager
def _process_kept(fn):
    """Whatever the function changes in the process comes back: the environment, torch's defaults,
    the function's own module globals (a shallow copy)."""
    env, dtype, grad, threads = dict(os.environ), torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()
    module_globals = getattr(fn, "__globals__", None)
    kept_globals = dict(module_globals) if module_globals is not None else None
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
        if module_globals is not None and module_globals is not vars(sys.modules[__name__]):
            module_globals.clear()
            module_globals.update(kept_globals)


def _error_finding(exc: BaseException, fn_name: str, library) -> Finding:
    where = user_line(traceback.extract_tb(exc.__traceback__), library)
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    release = refusing_release(exc)
    return Finding(
        "SV301", "error",
        f"{fn_name} raised {first}" + (f" at {where}" if where else "") + (f"; {release}" if release else "")
        + ". The plan below is what it had done until then.",
        fix=f"change {where.split(' (')[0] if where else fn_name} so that this call succeeds",
    )


def refusing_release(exc: BaseException) -> str:
    """Which torch release refuses this, where the error tells it."""
    text = str(exc)
    if "ignored_params" in text and "unexpected keyword" in text:
        return "torch 2.4-2.6 have no ignored_params (added in 2.7)"
    if "applied to a module once" in text:
        return "every torch release refuses a second fully_shard on one module"
    if "shared" in text and "FSDP" in text:
        return "torch 2.13 refuses a parameter shared by two FSDP groups at lazy init (older releases let it pass)"
    if "containers that do not implement forward" in text:
        return "torch refuses a ModuleList / ModuleDict without a forward of its own (fully_shard's _validate_module)"
    if "has no attribute 'modules'" in text or "Unsupported module" in text or "nn.Module" in text:
        kind = text.split("'")[1] if text.count("'") >= 2 else "something else"
        return f"fully_shard takes an nn.Module or a list of nn.Modules, on every release, and was given a {kind}"
    return ""


def _target_refusals(cap: Capture, fn_name: str, torch_version) -> Finding | None:
    """On a target release without ``ignored_params`` (< 2.7) the first call that passes it raises:
    the calls from that one on did not happen there."""
    if torch_version is None or parse_version(torch_version) >= (2, 7):
        return None
    for i, call in enumerate(cap.calls):
        if call.ignored:
            del cap.calls[i:]
            return Finding(
                "SV301", "error",
                f"{fn_name}: on torch {torch_version}, fully_shard raises TypeError: fully_shard() got an unexpected "
                f"keyword argument 'ignored_params' at {call.site}; torch 2.4-2.6 have no ignored_params (added in "
                "2.7). The plan below is what it had done until then.",
                fix=f"at {call.site.split(' (')[0]}: pass ignored_params only on torch >= 2.7 (as accelerate does), "
                    "or keep those parameters out another way",
            )
    return None


def as_mesh(world_size=None, mesh=None) -> Mesh:
    if mesh is not None and world_size is not None and mesh.world != world_size:
        raise ValueError(f"world_size={world_size} and mesh={mesh} disagree: pass one of them")
    if mesh is None and world_size is None:
        raise ValueError("capture needs world_size=N or mesh=sv.Mesh(...): the ranks the function runs on")
    return mesh if mesh is not None else Mesh(int(world_size))


def _bound(value, dmesh, mesh: Mesh):
    """An ``sv.Mesh`` argument becomes torch's DeviceMesh of the fake group (the function's own mesh)."""
    return dmesh if isinstance(value, Mesh) and value == mesh else value


def run_captured(fn, model: nn.Module, args=(), kwargs=None, *, mesh: Mesh, torch_version=None,
                 library=_LIBRARY_PARTS, fn_name: str | None = None) -> Capture:
    """Run ``fn(copy, *args, **kwargs)`` on a meta copy under the fake group; the sharded copy and the calls."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"capture needs the model as an nn.Module, got {type(model).__name__}")
    if not callable(fn):
        raise ValueError(f"capture needs a function that calls fully_shard, got {fn!r}")
    fn_name = fn_name or qualified_name(fn)
    copy_ = meta_copy(model)
    cap = Capture(copy_, {id(m): f for f, m in copy_.named_modules(remove_duplicate=False)},
                  {id(p): f for f, p in reversed(list(copy_.named_parameters(remove_duplicate=False)))},
                  library=library)
    with _process_kept(fn), fake_process_group(0, mesh.world):
        dmesh = device_mesh(mesh)
        args = tuple(_bound(a, dmesh, mesh) for a in args)
        kwargs = {k: _bound(v, dmesh, mesh) for k, v in (kwargs or {}).items()}
        before = {f: p.dtype for f, p in copy_.named_parameters() if p.requires_grad and p.dtype != torch.float32}
        with _cluster_on_cpu(mesh.world, 0, cap):
            try:
                out = fn(copy_, *args, **kwargs)
                if isinstance(out, nn.Module):
                    cap.root = out
            except Exception as exc:  # the user's code: the plan so far, and the error as a finding
                cap.error = _error_finding(exc, fn_name, library)
        cap.cast = tuple(f for f, p in ((strip_wrappers(f), p) for f, p in cap.root.named_parameters())
                         if f in before and p.dtype == torch.float32)
        cap.error = _target_refusals(cap, fn_name, torch_version) or cap.error
    return cap


def qualified_name(fn) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module.rpartition('.')[2]}.{name}" if module and module != "__main__" else name


def capture(fn, model: nn.Module, *args, world_size: int | None = None, mesh: Mesh | None = None,
            torch_version=None, **kwargs) -> Plan:
    """The plan ``fn(model, *args, **kwargs)`` makes, read back from torch's FSDP state.

    ``fn`` is the user's own function that calls ``fully_shard`` (and ``checkpoint_wrapper``,
    ``set_modules_to_*_prefetch``...); it runs on a meta copy of ``model`` under the fake process
    group of ``world_size`` ranks (or ``mesh``: an ``sv.Mesh`` argument to ``fn`` becomes that torch
    DeviceMesh). ``model`` and the process are left as they were. ``torch_version``: the release the
    function will run on; where it refuses a call the installed torch accepts, the plan stops there.
    The plan's ``origin`` holds what the capture found (``plan.origin.findings``; ``sv.analyze``
    reports them among its findings)."""
    mesh = as_mesh(world_size, mesh)
    if torch_version is not None:
        parse_version(torch_version)
    name = qualified_name(fn)
    cap = run_captured(fn, model, args, kwargs, mesh=mesh, torch_version=torch_version, fn_name=name)
    from ..checks.origin_checks import capture_findings, capture_fixes

    plan = cap.plan(Origin("capture", name, f"torch {torch.__version__.split('+')[0]}", fixes=capture_fixes(name)))

    found = capture_findings(model, plan)
    return replace(plan, origin=replace(plan.origin, findings=plan.origin.findings + tuple(found)))


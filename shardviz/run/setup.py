"""What a plan file records of the run besides the plan: the mesh (HSDP split, device, limits) and
the training (optimizer, precision, micro-batch), as plain JSON objects (``Plan.to_json(setup=...)``,
``plan.setup``). Written from a ``Mesh`` and a ``Training`` and read back into equal ones, so
``plan search -o p.json`` -> ``export --plan p.json`` -> ``report --plan p.json`` need no flag repeated.

Every field read back is checked by ``Mesh`` / ``Training`` themselves; an unknown one is refused
naming the closest field.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, fields

from .devices import DEVICES, Device, Efficiency
from .mesh import Mesh
from .training import Training


def _closest(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f"; closest: {close[0]!r}" if close else ""


def _check_fields(obj, cls, where: str) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"plan file: field {where!r} must be an object, got {obj!r}")
    known = [f.name for f in fields(cls)]
    for key in obj:
        if key not in known:
            raise ValueError(f"plan file: field '{where}.{key}' is not a {cls.__name__} field{_closest(key, known)}")
    return dict(obj)


def mesh_to_obj(mesh: Mesh) -> dict:
    """The mesh's fields as JSON: the shape, the device (its name for a row of ``DEVICES``) and only
    the figures that differ from the device's own, so a different ``--device`` later still fills them."""
    bare = Mesh(shard=mesh.shard, replicate=mesh.replicate, device=mesh.device)
    obj = {"shard": mesh.shard, "replicate": mesh.replicate}
    device = mesh.device
    if device is not None:
        obj["device"] = device.name if DEVICES.get(device.name) == device else asdict(device)
    if mesh.efficiency is not None:
        obj["efficiency"] = asdict(mesh.efficiency)
    for f in fields(mesh):
        value = getattr(mesh, f.name)
        if f.name not in obj and f.name not in ("device", "efficiency") and value != getattr(bare, f.name):
            obj[f.name] = value
    return obj


def mesh_from_obj(obj) -> Mesh:
    """``mesh_to_obj``'s JSON -> the ``Mesh``; ValueError naming the field for anything wrong."""
    obj = _check_fields(obj, Mesh, "mesh")
    try:
        if isinstance(obj.get("device"), dict):
            obj["device"] = Device(**_check_fields(obj["device"], Device, "mesh.device"))
        if isinstance(obj.get("efficiency"), dict):
            obj["efficiency"] = Efficiency(**_check_fields(obj["efficiency"], Efficiency, "mesh.efficiency"))
        return Mesh(**obj)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"plan file: field 'mesh': {exc}") from None


def training_to_obj(training: Training) -> dict:
    """Every field of the training as JSON; ``example_inputs`` (a function) cannot be written."""
    if training.example_inputs is not None:
        raise ValueError("Training.example_inputs is a function: a plan file cannot record it "
                         "(write the plan without its training)")
    return {f.name: getattr(training, f.name) for f in fields(training) if f.name != "example_inputs"}


def training_from_obj(obj) -> Training:
    """``training_to_obj``'s JSON -> the ``Training``; ValueError naming the field for anything wrong."""
    obj = _check_fields(obj, Training, "training")
    try:
        return Training(**obj)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"plan file: field 'training': {exc}") from None


def setup_obj(mesh: Mesh | None = None, training: Training | None = None) -> dict:
    """``Plan.to_json(setup=...)``'s argument: what is known of the run."""
    return {"mesh": None if mesh is None else mesh_to_obj(mesh),
            "training": None if training is None else training_to_obj(training)}


def read_setup(plan) -> tuple[Mesh | None, Training | None]:
    """The mesh and training a plan file recorded (``plan.setup``), each None when it has none (or no plan)."""
    setup = plan.setup if plan is not None else {}  # no plan yet (plan search)
    mesh = mesh_from_obj(setup["mesh"]) if "mesh" in setup else None
    training = training_from_obj(setup["training"]) if "training" in setup else None
    return mesh, training

"""What the Inspector's typed fields accept, and what they warn about: never a silent fallback.

- device memory: empty for no limit, a bare number in GiB (the field's unit), a size with its
  unit ("80GiB", "96 GB", "1.5TiB"), or a device name as ``sv.Mesh(device=...)`` takes it ("H100":
  its memory, bandwidths and GPUs per node); a size must be above the mesh's memory reserve and at
  most ``MAX_DEVICE_MEMORY``; anything else is refused with a message naming the field;
- counts (rank, world, replicate, batch, sequence length): whole numbers, refused otherwise (never
  rounded); a micro-batch of more than ``MAX_TOKENS`` tokens is refused (no step to measure);
- sequence length: above the model's ``max_position_embeddings`` it is accepted (the memory still
  follows it) but the controls say the model was not built for it.
"""

from __future__ import annotations

import dataclasses
import math
import re

from ..run.devices import device_by_name
from ..format import format_bytes, format_count, parse_size
from ..run.mesh import Mesh
# the sequence-length warning is the command line's and the report's too: one function, in shardviz.views.display
from ..views.display import max_positions, seq_len_note  # noqa: F401

#: Far above every device shardviz knows (the largest has 288 GiB): a larger number is a typo.
MAX_DEVICE_MEMORY = 64 * 1024**4
#: Tokens per rank in one micro-batch (batch x sequence) the Inspector measures: 16 Mi, 128 x the
#: 131,072 positions of Llama 3.1; more is a typo that would run for minutes.
MAX_TOKENS = 2**24


#: Each control's one name: its label on screen and the name every message about it uses (the TP
#: field was "tensor degree", "tensor parallel" and "tensor_parallel" in its messages).
FIELD_NAMES = {"world": "world size", "replicate": "HSDP replicate", "tensor": "TP", "device_memory": "device memory",
               "batch_size": "batch size", "seq_len": "sequence length", "rank": "rank"}


class FieldError(ValueError):
    """A value a control refused: ``field`` is the control's key (``FIELD_NAMES``), so that the front
    end highlights that input; the message starts with the field's one name."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def field_error(field: str, exc: Exception) -> FieldError:
    """``exc`` (from the engine, in its API's words) as a message about control ``field``, by its one name."""
    if isinstance(exc, FieldError):
        return exc
    name = FIELD_NAMES[field]
    text = re.sub(r"^tensor_parallel(\[[^\]]*\])?\s*[:=]?\s*", "", str(exc).strip("'\"")).replace("tensor degree", name)
    return FieldError(field, text if text.startswith(name) else f"{name}: {text}")


def whole(name: str, value, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int, if it is a whole number in [low, high]; else a ValueError naming the
    field and the closest valid value (2.7 is refused, not made 3)."""
    field = next((k for k, v in FIELD_NAMES.items() if v == name), name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(field, f"{name} {value!r}: give a whole number")
    top = high if high is not None else math.inf
    closest = int(min(max(round(value), low), top))
    if value != int(value):
        raise FieldError(field, f"{name} {value:g}: give a whole number (closest: {closest:,})")
    if not low <= value <= top:
        span = f"from {low:,} to {high:,}" if high is not None else f"{low:,} or more"
        raise FieldError(field, f"{name} {int(value):,}: give a number {span} (closest: {closest:,})")
    return int(value)


def check_tokens(batch_size, seq_len) -> None:
    """Refuse a micro-batch of more than ``MAX_TOKENS`` tokens, naming the largest batch that fits."""
    if batch_size is None or batch_size * seq_len <= MAX_TOKENS:
        return
    most = max(MAX_TOKENS // seq_len, 0)
    closest = f"batch size {most:,} at this sequence length" if most else f"sequence length {MAX_TOKENS // batch_size:,}"
    raise FieldError("batch_size", f"batch size {format_count(batch_size)} x sequence length {format_count(seq_len)} = "
                     f"{format_count(batch_size * seq_len)} tokens per rank: the Inspector measures micro-batches "
                     f"of up to {format_count(MAX_TOKENS)} tokens (closest: {closest})")


def device_field(text, mesh) -> dict:
    """The device-memory field's text -> ``set_mesh`` keywords: ``device_memory`` in bytes (None: no
    limit), or a device name's own mesh fields. ValueError naming the field for anything else."""
    raw = "" if text is None else str(text).strip()
    reserve = format_bytes(mesh.memory_reserve)
    if re.match(r"^[-+]\s*[0-9.]", raw):  # a signed number is a size typed wrong, never a device name
        raise FieldError("device_memory", f"device memory {raw!r}: a size is never negative or signed; give more than the "
                         f"{reserve} reserve, e.g. 80 (GiB), 80GiB or 96GB, or leave it empty for no limit")
    if raw and not re.match(r"^[0-9.]", raw):
        try:
            device = device_by_name(raw)  # as sv.Mesh(device=...) reads it
        except ValueError as exc:
            raise FieldError("device_memory", f"device memory {raw!r}: give a size such as 80 (GiB), 80GiB or 96GB, or "
                             f"leave it empty for no limit; as a device name: {exc}") from None
        return {"device": device.name}
    size = parse_device_memory(raw, mesh.memory_reserve)
    if size is None and mesh.device is not None:
        raise FieldError("device_memory", f"device memory: the mesh's device {mesh.device.name} has {format_bytes(mesh.device.memory)}, "
                         "which the numbers use; a mesh with a device has a limit: type another size (e.g. 40), "
                         "or build the Inspector with sv.Mesh(shard=..., device=None) for no limit")
    if size is not None and size <= mesh.memory_reserve:
        raise FieldError("device_memory", f"device memory {raw!r} ({format_bytes(size)}) is not more than the "
                         f"{format_bytes(mesh.memory_reserve)} the mesh keeps in reserve (CUDA context, NCCL): "
                         f"nothing would be usable; give more than {format_bytes(mesh.memory_reserve)}, or leave it empty for no limit")
    if size is not None and size > MAX_DEVICE_MEMORY:
        raise FieldError("device_memory", f"device memory {raw!r}: more than {format_bytes(MAX_DEVICE_MEMORY)}, far above any device "
                         "(the largest known has 288 GiB); give the memory of one device, e.g. 80")
    return {"device_memory": size}


def parse_device_memory(text, reserve: int = 0) -> int | None:
    """The device-memory field's text -> bytes (None: no limit; 0 stays 0, for the caller to say it
    must exceed the ``reserve``); a ``FieldError`` naming the field for junk."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip()
    try:
        size = parse_size(raw, "device memory")  # the API's and the command line's reading: a bare number is GiB
    except (ValueError, OverflowError):
        size = None
    if size is None or size < 0 or (size == 0 and not reserve):
        raise FieldError("device_memory", f"device memory {raw!r}: give a size such as 80 (GiB), 80GiB or 96GB, "
                         "or leave it empty for no limit")
    return size


def mesh_fields(kw: dict, mesh) -> dict:
    """The mesh controls' values (``set_mesh``'s arguments), validated as ``sv.Mesh`` reads them."""
    for key in ("world", "replicate", "tensor"):
        if key in kw:
            kw[key] = whole(FIELD_NAMES[key], kw[key])
    if "device_gib" in kw:
        gib = kw.pop("device_gib")
        kw["device_memory"] = None if gib is None else f"{gib}"
    if "device_memory" in kw:
        fields = device_field(kw.pop("device_memory"), mesh)  # junk: a message naming the field
        if "device" in fields:  # a device name: its memory, links and GPUs per node, as sv.Mesh(device=...)
            fresh = Mesh(shard=mesh.shard, replicate=mesh.replicate, device=fields["device"],
                         memory_reserve=mesh.memory_reserve)
            fields = {f.name: getattr(fresh, f.name) for f in dataclasses.fields(Mesh)
                      if f.name not in ("shard", "replicate")}
        kw.update(fields)
    return kw


def training_fields(kw: dict, tr) -> dict:
    """The training controls' values (``set_training``'s), validated as ``sv.Training`` reads them."""
    for k in ("param_dtype", "reduce_dtype"):
        if k in kw and not kw[k]:
            kw[k] = None
    if kw.get("batch_size") is not None:
        kw["batch_size"] = whole("batch size", kw["batch_size"])
    if "seq_len" in kw:
        kw["seq_len"] = whole("sequence length", kw["seq_len"])
    check_tokens(kw.get("batch_size", tr.batch_size), kw.get("seq_len", tr.seq_len))
    return kw

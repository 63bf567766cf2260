"""What the Inspector's typed fields accept, and what they warn about: never a silent fallback.

- device memory: empty for no limit, a bare number in GiB (the field's unit), or a size with its
  unit ("80GiB", "96 GB", "1.5TiB"); anything else is refused with a message naming the field;
- sequence length: above the model's ``max_position_embeddings`` it is accepted (the memory still
  follows it) but the controls say the model was not built for it.
"""

from __future__ import annotations

import re

from ..fsdp import parse_bytes

GIB = 1024**3


def parse_device_memory(text) -> int | None:
    """The device-memory field's text -> bytes (None: no limit); ValueError naming the field for junk."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip()
    try:
        size = int(float(raw) * GIB) if re.fullmatch(r"[0-9]*\.?[0-9]+(e[0-9]+)?", raw) else parse_bytes(raw)
    except ValueError:
        size = None
    if size is None or size <= 0:
        raise ValueError(f"device memory {raw!r}: give a size such as 80 (GiB), 80GiB or 96GB, "
                         "or leave it empty for no limit")
    return size


def max_positions(model) -> int | None:
    """The model's ``config.max_position_embeddings`` (a peft model's base config too), if it has one."""
    seen = model
    for _ in range(4):  # PeftModel -> LoraModel -> the transformers model
        if seen is None:
            break
        n = getattr(getattr(seen, "config", None), "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
        seen = getattr(seen, "base_model", None) if getattr(seen, "base_model", None) is not seen else None
    return None


def seq_len_note(model, seq_len) -> str | None:
    """A warning when the sequence length is beyond what the model's positions cover."""
    limit = max_positions(model) if model is not None else None
    if limit is None or not seq_len or seq_len <= limit:
        return None
    return (f"sequence length {seq_len:,} is above this model's max_position_embeddings ({limit:,}): "
            "it was not built for sequences this long")

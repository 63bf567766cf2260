"""What the Inspector's typed fields accept, and what they warn about: never a silent fallback.

- device memory: empty for no limit, a bare number in GiB (the field's unit), or a size with its
  unit ("80GiB", "96 GB", "1.5TiB"); anything else is refused with a message naming the field;
- sequence length: above the model's ``max_position_embeddings`` it is accepted (the memory still
  follows it) but the controls say the model was not built for it.
"""

from __future__ import annotations

from ..format import parse_size
# the sequence-length warning is the command line's and the report's too: one function, in views
from ..views import max_positions, seq_len_note  # noqa: F401



def parse_device_memory(text) -> int | None:
    """The device-memory field's text -> bytes (None: no limit); ValueError naming the field for junk."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip()
    try:
        size = parse_size(raw, "device memory")  # the API's and the command line's reading: a bare number is GiB
    except ValueError:
        size = None
    if size is None or size <= 0:
        raise ValueError(f"device memory {raw!r}: give a size such as 80 (GiB), 80GiB or 96GB, "
                         "or leave it empty for no limit")
    return size


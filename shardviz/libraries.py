"""Third-party libraries' own messages, kept off the user's screen where they are not the user's answer.

transformers' model base (``MODEL_BASE``, imported when a model is built: ``zoo``, ``model.load``) and
peft (when LoRA is added or an adapter read) import torchao and bitsandbytes when they are installed
(``shardviz[qlora,torchao]``). At import, torchao says its CUDA kernels failed to load (on a CPU
machine), torch says torchao registers enums as pytree constants, and bitsandbytes (through
``kernels``) says it could not fetch a CPU 4-bit kernel from the hub (offline). Under a notebook
cell that builds a model on the meta device, five such lines read as failures of shardviz; none
concerns what it computes (no kernel runs on meta). ``import_quietly`` imports such a library with
them hidden (``quiet_messages``, which the command line holds while it runs:
``cli.terminal.quiet_libraries``). Errors still show.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType

# torchao: its missing CUDA kernels; kernels (transformers 5.25's dependency): bitsandbytes asks it for a
# hub kernel at import, and offline it says it skips the publisher check
QUIET_LOGGERS = ("bitsandbytes", "peft", "accelerate", "torchao", "torch.utils._pytree", "kernels")
#: what imports torchao and bitsandbytes when a model is built: transformers' model base (its quantizers)
MODEL_BASE = "transformers.modeling_utils"


@contextlib.contextmanager
def quiet_messages() -> Iterator[None]:
    """While it holds, the libraries' loggers (``QUIET_LOGGERS``) pass errors only and Python warnings
    from outside shardviz are hidden; the loggers' levels and the warning filters are put back afterwards."""
    quiet = {name: logging.getLogger(name) for name in QUIET_LOGGERS}
    levels = {name: log.level for name, log in quiet.items()}
    for log in quiet.values():
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            warnings.filterwarnings("default", module=r"shardviz(\.|$)")
            yield
    finally:
        for name, log in quiet.items():
            log.setLevel(levels[name])


def import_quietly(name: str) -> ModuleType:
    """``importlib.import_module(name)``, its first import made under ``quiet_messages``; imported
    already: as it is."""
    if name in sys.modules:
        return sys.modules[name]
    with quiet_messages():
        return importlib.import_module(name)


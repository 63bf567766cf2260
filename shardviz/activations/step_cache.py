"""The key/value-cache decision of a training step, in one place, and the measured step it leads to.

``step_cache`` says which ``use_cache`` the step runs with and why (the words the activation
profile's assumptions carry); ``Analysis.use_cache``, the search (``Space.cache_of``), the checks
(SV113, SV201) and the exported code (``model.config.use_cache = False``) all read it.
``MeasuredStep`` is the activation stage's value: the profile torch measured, and why the step was
measured without the cache the training asks for (``cache_refused``), set once when it is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from .measure import config_use_cache
from .profile import ActivationProfile


@dataclass(frozen=True)
class StepCache:
    """Whether the step keeps the key/value cache (``use_cache``), whether the config keeps one
    (``config_keeps``: the exported code turns it off when the step does not), and ``why``, the
    assumption that says so (None: a step of the user's own ``example_inputs``, not a Hugging Face forward)."""

    use_cache: bool
    config_keeps: bool
    why: str | None

    @property
    def turned_off(self) -> bool:
        """The config keeps a cache the step runs without: the exported code sets ``model.config.use_cache = False``."""
        return self.config_keeps and not self.use_cache


def step_cache(model, training, checkpointed: bool) -> StepCache:
    """The ``use_cache`` ``training``'s step of ``model`` runs with (``Training.step_use_cache``):
    the training's, else the config's, off when the plan checkpoints modules (``checkpointed``:
    Hugging Face's rule under gradient checkpointing); the config's is ignored for ``example_inputs``."""
    own_inputs = training.example_inputs is not None
    keeps = config_use_cache(model)
    use_cache = training.step_use_cache(keeps and not own_inputs, checkpointed)
    if training.use_cache is not None:
        why = f"use_cache={training.use_cache} (Training(use_cache={training.use_cache}))"
    elif own_inputs:
        why = None
    elif keeps and checkpointed:
        why = ("use_cache=False: the config keeps use_cache=True, but the plan checkpoints modules, and Hugging "
               "Face's own gradient checkpointing turns the cache off in training (transformers "
               "utils/generic.py, merge_with_config_defaults); the exported code sets model.config.use_cache = False")
    else:
        why = f"use_cache={keeps} (the config's)"
    return StepCache(use_cache, keeps, why)


def selective_cache_refusal(checkpoint, use_cache: bool) -> str | None:
    """Why torch cannot run a step that keeps the key/value cache (``use_cache``) with modules
    checkpointed selectively (``checkpoint``: a ``Plan.checkpoint``); None when it can. The
    recomputation updates the cache again, so it runs other ops than the forward did, and torch's
    selective checkpointing raises in backward (checked: tests/test_activation_truth.py). The analysis
    then measures the step without the cache; the finding is SV113 (``checks.selective_with_cache``)."""
    selective = checkpoint.selective
    if not selective or not use_cache:
        return None
    n = len(selective)
    return (f"{n} module{'' if n == 1 else 's'} checkpointed selectively with use_cache=True: the recomputation in "
            "backward fills the key/value cache again, and torch's selective checkpointing raises ('... invocation "
            "index ... encountered during backward but not found in storage'); priced with use_cache=False")


@dataclass(frozen=True)
class MeasuredStep:
    """The activation stage: the step torch measured (``profile``, its assumptions saying which
    ``use_cache`` and why) and, when torch cannot run the plan with the cache the training asks
    for, why it was measured without it (``cache_refused``; None: measured as asked)."""

    profile: ActivationProfile
    cache_refused: str | None = None


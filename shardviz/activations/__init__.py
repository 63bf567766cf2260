"""Activation memory of one training step, measured by torch itself on fake tensors.

What it answers: how many bytes of activations (tensors saved for backward, temporaries, the
step's inputs, gradients of activations during backward) are alive at every module boundary of a
forward+backward step at ``batch_size`` x ``seq_len``, with or without activation checkpointing,
in the dtypes the parameters compute in. Parameters, parameter gradients, buffers and optimizer
states are NOT counted: the cost model knows them exactly.

How (no formula, torch is the measurement):

1. A *reduced copy* of the model is built without touching the user's model: every repeated
   block list (``presets.find_blocks``) is replaced by a short ``nn.ModuleList`` holding one copy
   per *variant* - a variant is (block kind, which of its submodules are checkpointed), a kind is
   (class, parameter names/shapes/compute dtypes/requires_grad). The list always starts with a
   copy of the variant of position 0 (the first block sees an input that may not require grad:
   frozen embeddings), then one *steady* copy of every variant, always including the plain and
   the fully checkpointed one of every kind (so toggling block-level checkpointing reuses the
   measurement). Parameters are fresh fake tensors (``FakeTensorMode``: no memory, no values),
   cast to the dtype they compute in (``param_dtype`` for parameters FSDP shards, their own for
   ``whole_params``). Checkpointed modules are wrapped in torch's ``checkpoint_wrapper``
   (non-reentrant), as the exported code does before ``fully_shard``.
2. One real forward+backward of that copy runs under ``FakeTensorMode`` and torch's
   ``MemTracker`` (``torch.distributed._tools.mem_tracker``), which categorises every storage
   (parameter, buffer, gradient, activation, temporary). We keep a timeline of module events
   (pre/post forward, pre/post backward, recomputation) with the activation level (activation +
   temporary + other bytes) at each and the highest level reached since the previous event.
3. The timeline is spliced into the full model's: each block position gets the event run of its
   variant's representative (position 0 the first copy's), levels being additive. A block's run
   includes the release of its inputs right after its forward (the caller drops the previous
   hidden state unless someone saved it), so runs do not depend on their neighbours.

The step is the user's ordinary one: Hugging Face models ``loss = model(input_ids=ids,
labels=ids).loss`` with the config's ``use_cache`` (its key/value cache counted when the config keeps
it; ``use_cache=False`` on request) (seq2seq: HF derives ``decoder_input_ids`` from the labels),
the output object dropped, ``loss.backward()``; other modules ``example_inputs(batch, seq) ->
(args, kwargs)``, loss = ``out.loss`` if present else the sum of the output's floating tensors.
The model copy is put in train mode. See ``docs/activations.md`` for the assumptions (attention
kernel, MoE routing).

The same pass counts the step's FLOPs with torch's ``FlopCounterMode`` (forward, backward,
recomputation), attributed to modules and spliced over the blocks like the levels (``flops``).

Modules: ``profile`` (the results, and the numbers per module read off the timeline), ``recorder`` (MemTracker's categorisation, our timeline),
``patches`` (where fake tensors trip over model code), ``reduced`` (the copy), ``kvcache`` (the
key/value cache of a step that keeps it: one cache layer per copy, its death per block), ``splice``
(the copy's timeline into the full model's), ``flops`` (FLOPs per
module and per unit), ``opcost`` (each op's FLOPs, bytes and kernel, in buckets a roofline times),
``measure`` (the entry point; ``read_run_order``, the module order from a forward alone), ``measure_cache`` (the one cache of measured steps, and what a forked copy measured brought back), ``step_cache`` (the step's ``use_cache`` and why, and
the measured step).
"""

from .flops import FLOP_COLUMNS, ModuleFlops, flop_formulas, op_costs_per_call, unit_flops
from .measure import config_use_cache, measure_activations, read_run_order
from .measure_cache import clear_cache
from .profile import ActivationProfile, ModuleEvent, ModuleActivations
from .step_cache import MeasuredStep, StepCache, selective_cache_refusal, step_cache

__all__ = ["FLOP_COLUMNS", "ActivationProfile", "MeasuredStep", "ModuleEvent", "ModuleActivations", "ModuleFlops",
           "StepCache", "clear_cache", "config_use_cache", "flop_formulas", "measure_activations", "read_run_order", "op_costs_per_call", "selective_cache_refusal", "step_cache", "unit_flops"]

"""SV202: the caching allocator reserves much more than the step's tensors hold, priced with
``expandable_segments:True``.

The verdict judges the reserved peak (``a.memory.reserved_peak``, docs/cost-model.md, "Reserved
memory"): what ``torch.cuda.max_memory_reserved`` would show, the allocated peak plus the cached
segments' free space. With torch's default allocator (``expandable_segments`` off:
``CUDAAllocatorConfig``'s ``use_expandable_segments_`` is false) each stream's cache keeps
segments sized for the requests that opened them; ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
(what torchtitan's launcher ``run_train.sh`` sets) maps pages at the end of one segment per stream
instead. ``check_reserved_gap`` says how large the gap is, what the other setting reserves (the
same step replayed, ``AnalysisView.costs.reserved_overhead(True)``, no new analysis) and how to set it.

It reads the verdict only through ``AnalysisView.fit`` (verdict, margin, usable, safety) and the
memory table's columns (``peak``, ``reserved_peak``); SV201 (``memory_checks``) says whether it fits.
"""

from __future__ import annotations

from dataclasses import replace

from .check_inputs import AnalysisView
from ..finding import Finding
from ..format import format_bytes

#: SV202 fires when reserved − allocated is more than this fraction of the usable memory ...
RESERVED_GAP = 0.10
# When the plan is over or tight, SV201 says so and prices --expandable-segments among its fixes:
# one finding per fact, so SV202 speaks only for a plan that fits.

FIX = ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch touches the GPU "
       "(sv.Mesh(expandable_segments=True), CLI --expandable-segments; the exported code then sets it with "
       "os.environ.setdefault before import torch). torch's default is off; torchtitan's launcher sets it on")


def check_reserved_gap(inputs: AnalysisView) -> list[Finding]:
    """SV202 (``RESERVED_GAP``, info): a plan that fits, whose reserved peak on the worst rank is more
    than 10 % of the usable memory above the allocated peak. Not raised when the mesh already assumes
    expandable segments, judges the allocated peak, or has no device; an over or tight plan is SV201's."""
    mesh = inputs.mesh
    if mesh.device_memory is None or mesh.expandable_segments or mesh.judge != "reserved":
        return []  # judged on the allocated peak, the allocator's cache decides nothing
    fit = inputs.fit
    if fit is None or fit.usable <= 0:
        return []
    mem = inputs.memory
    worst = mem["reserved_peak"].idxmax()  # the peaks a.fit judges: the highest of all ranks
    peak, reserved = int(mem["peak"].max()), int(mem.at[worst, "reserved_peak"])
    gap = reserved - peak
    if fit.verdict != "fits" or gap <= RESERVED_GAP * fit.usable:
        return []
    grown = peak + inputs.costs.reserved_overhead(True)
    # the one verdict (Mesh.fit) of the same step under the other allocator setting, judged as every surface judges
    other = replace(mesh, expandable_segments=True).fit(peak, grown)
    rank = int(mem.at[worst, "rank"])
    message = (f"the caching allocator reserves {format_bytes(reserved)} on rank {rank}, {format_bytes(gap)} "
               f"({100 * gap / fit.usable:.0f} % of {format_bytes(fit.usable)} usable) above the "
               f"{format_bytes(peak)} its tensors hold at their peak (torch's default allocator: cached "
               f"segments per stream). With expandable_segments:True the same step reserves {format_bytes(grown)} "
               f"({format_bytes(reserved - grown)} less): {other.word}, {other.spare_text}")
    return [Finding("SV202", "info", message, fix=FIX, flags="--expandable-segments")]

"""What torch did, read off a sharded module tree: the truth ``sv.capture`` is held against.

``torch_calls(root)`` is one entry per ``fully_shard`` call that manages parameters (its FSDP state):
the module names (checkpoint / compile wrapper segments dropped), the parameter names it shards,
reshard-after-forward, the MixedPrecisionPolicy's param and reduce dtypes, offload. Read with
torch's own attributes, independently of shardviz's capture code.
"""

from __future__ import annotations

import os

from torch import nn

WRAPPERS = ("_checkpoint_wrapped_module", "_orig_mod")


def strip(fqn: str) -> str:
    return ".".join(p for p in fqn.split(".") if p not in WRAPPERS)


def torch_calls(root: nn.Module) -> set:
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

    names = {}
    for fqn, m in root.named_modules(remove_duplicate=False):
        names.setdefault(id(m), strip(fqn))
    calls, seen = set(), set()
    for m in root.modules():
        if not isinstance(m, FSDPModule):
            continue
        state = fully_shard.state(m)
        group = state._fsdp_param_group
        if id(state) in seen or group is None:
            continue
        seen.add(id(state))
        if state._auto_reshard_after_forward:
            reshard = None
        elif group.post_forward_mesh_info is None:
            reshard = False
        elif group.post_forward_mesh_info.shard_mesh_size == group.mesh_info.shard_mesh_size:
            reshard = True
        else:
            reshard = group.post_forward_mesh_info.shard_mesh_size
        params = frozenset(strip(f"{names[id(fp._module_info.module)]}.{fp._module_info.param_name}".lstrip("."))
                           for fp in group.fsdp_params)
        calls.add((frozenset(names[id(x)] for x in state._modules), params, reshard,
                   str(group.mp_policy.param_dtype), str(group.mp_policy.reduce_dtype),
                   isinstance(group.offload_policy, CPUOffloadPolicy)))
    return calls


def checkpointed(root: nn.Module) -> set:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    return {strip(f) for f, m in root.named_modules() if isinstance(m, ActivationWrapper)}


class KeptEnviron:
    """os.environ as it was, put back on exit (accelerate's preparation reads and sets it)."""

    def __enter__(self):
        self.saved = dict(os.environ)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.saved)

"""The one message schema between the Inspector's Python half and its front end.

Defined here once. Python checks every message it receives against it (``check_action``); the
front end receives the same table as the ``protocol`` trait and checks every message before it
sends it (``front/base.js``: ``send``), so a name or argument that one side does not know is
refused on both sides (tests/test_widget_protocol_js.py runs both checks on the same messages).

Front end -> Python:
    {"type": "hello", "req": 0}                                   on render
    {"type": "action", "action": NAME, "args": {...}, "req": n}   every click / edit
Python -> front end (custom messages; everything else is a synced trait):
    {"type": "rows", "revision", "reset", "rows", "order"?, "truncated", "filtering", "matches", "filter_label"}
    {"type": "reveal", "id"}
    {"type": "ack", "req", "ok", "error", "action", "ms", ...}     one per request
"""

from __future__ import annotations

#: Argument kinds: "str", "int", "bool", "number", "list", "any", each optionally "|null".
#: action name -> {argument: kind}; every argument may be left out unless listed in REQUIRED.
ACTIONS: dict[str, dict[str, str]] = {
    # the plan (each one undo step)
    "toggle_unit": {"fqn": "str"},
    "make_unit": {"fqn": "str"},
    "remove_unit": {"fqn": "str"},
    "set_reshard_after_forward": {"fqn": "str", "value": "any"},
    "toggle_ignored": {"fqn": "str"},
    "ignore": {"fqns": "list"},
    "unignore": {"fqns": "list"},
    "ignore_lora": {"module_fqn": "str"},
    "unignore_lora": {"module_fqn": "str"},
    "toggle_checkpoint": {"fqn": "str"},
    "checkpoint_blocks": {"on": "bool"},
    "apply_to_many": {"targets": "any", "action": "str", "value": "any"},
    "apply_to_type": {"type_or_fqn": "str", "action": "str", "within": "str", "value": "any"},
    "apply_preset": {"name": "str"},
    # mesh and training (undo steps too)
    # device_memory: the field's text ("80", "80GiB", "" = no limit); device_gib: a number of GiB
    # the counts are numbers: Python refuses one that is not whole, naming the field (never rounded)
    "set_mesh": {"world": "number", "replicate": "number", "tensor": "number", "device_memory": "str|null",
                 "device_gib": "number|null"},
    "set_training": {"optimizer": "str", "param_dtype": "str|null", "reduce_dtype": "str|null",
                     "offload": "bool", "batch_size": "number|null", "seq_len": "number"},
    "apply_suggestion": {"index": "int"},  # a row of the last search: plan, HSDP split, micro-batch
    "apply_fix": {"code": "str"},  # the top finding's fix, where it is a change of plan, mesh or training
    "undo": {},
    "redo": {},
    # the view (not undoable)
    "expand": {"target": "str", "open": "bool"},
    "collapse_all": {},
    "set_filter": {"text": "str", "status": "str", "role": "str"},
    "filter_finding": {"code": "str"},
    "set_rank": {"rank": "number"},
    "reveal": {"fqn": "str"},
    "pin": {},
    "suggest": {"top": "int"},  # runs sv.search: the panel shows "searching N plans…" meanwhile
    "cancel": {},  # stops what runs in the background (measuring, checking, searching)
    "unpin": {},
    # export
    "set_tab": {"tab": "str"},
    "set_torch_version": {"version": "str"},
    "save_code": {"path": "str", "overwrite": "bool"},
    "verify": {},
    "overwrite_plan_file": {},
    "dismiss_messages": {},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "toggle_unit": ("fqn",), "make_unit": ("fqn",), "remove_unit": ("fqn",),
    "set_reshard_after_forward": ("fqn", "value"), "toggle_ignored": ("fqn",), "ignore": ("fqns",),
    "unignore": ("fqns",), "toggle_checkpoint": ("fqn",), "apply_to_many": ("targets", "action"),
    "apply_to_type": ("type_or_fqn", "action"), "apply_preset": ("name",), "expand": ("target",),
    "set_rank": ("rank",), "reveal": ("fqn",), "filter_finding": ("code",), "set_tab": ("tab",), "set_torch_version": ("version",),
    "save_code": ("path",), "apply_suggestion": ("index",), "apply_fix": ("code",),
}
MESSAGE_TYPES = ("hello", "action")
TABS = ("charts", "compare", "findings", "suggest", "export")


def _kind_ok(value, kind: str) -> bool:
    kinds = kind.split("|")
    if value is None:
        return "null" in kinds or "any" in kinds
    for k in kinds:
        if k == "any":
            return True
        if k == "str" and isinstance(value, str):
            return True
        if k == "bool" and isinstance(value, bool):
            return True
        if k == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if k == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if k == "list" and isinstance(value, list):
            return True
    return False


def check_action(action, args) -> str | None:
    """None when ``{"action": action, "args": args}`` follows the schema, else why not.

    The front end's ``checkAction`` (front/base.js) gives the same verdict for the same message.
    """
    if action not in ACTIONS:
        return f"unknown action {action!r}"
    if not isinstance(args, dict):
        return f"action {action!r}: args must be an object"
    spec = ACTIONS[action]
    unknown = sorted(set(args) - set(spec))
    if unknown:
        return f"action {action!r} takes no argument(s) {unknown}"
    missing = [a for a in REQUIRED.get(action, ()) if a not in args]
    if missing:
        return f"action {action!r} needs argument(s) {missing}"
    for name, value in args.items():
        if not _kind_ok(value, spec[name]):
            return f"action {action!r}: argument {name!r} must be {spec[name]}, got {type(value).__name__}"
    return None


def schema() -> dict:
    """What the front end receives (the ``protocol`` trait)."""
    return {"actions": ACTIONS, "required": REQUIRED, "message_types": list(MESSAGE_TYPES), "tabs": list(TABS)}

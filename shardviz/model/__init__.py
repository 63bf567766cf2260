"""The model, read once: ``tree`` (``ModelTree``: parameters, sharing, roles), ``load``
(``sv.load_model``: a config and an adapter built on meta) and ``quant`` (bitsandbytes 4-bit
weights on meta)."""

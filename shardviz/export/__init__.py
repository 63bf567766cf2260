"""An analysis turned into what runs: ``codegen`` (``sv.export_code``), its tensor-parallel part
(``codegen_tp``), and ``oracle`` (``sv.verify``: torch's own ``fully_shard`` on a meta copy)."""

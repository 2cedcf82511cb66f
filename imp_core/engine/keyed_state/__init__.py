"""Keyed operator state: one contract (``contract.py``: fetch the touched keys, replace them, scan, commit to a
version, abort, open a version; bag semantics), its typed versions (``versions.py``) and the memory store
(``memory.py``). The Delta store is ``imp_core/spark/keyed_store.py``. See docs/design/state-contract.md.
"""

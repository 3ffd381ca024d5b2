"""Fence gates for SQL databases: a lease's fence checked where the write lands.

    with db.transaction():
        redlease.sql.fence_gate(db, "account:7", lease.fence)  # first: StaleFence if stale
        db.execute("UPDATE accounts SET balance = ...")        # conditional on the fence

``fence_gate`` records the greatest fence that has passed for a resource in a table of
its own (``create_table``), inside the caller's transaction, and refuses a smaller one
with ``StaleFence``; ``gated_execute`` is the same gate sent with the transaction's first
statement (one round trip on PostgreSQL); ``fenced_update`` is the one-statement form
for a fence kept on the row itself. The ``a``-prefixed twins take asyncio connections.
See the fencing guide.

The package: ``_gate`` holds the gate's rules without I/O (its statements on each
dialect, how each kind of connection runs them, its arguments); ``_async`` runs them on
an asyncio connection, and ``_sync``, generated from it by ``scripts/unasync.py``, on a
blocking one.
"""

from .._base.errors import StaleFence
from ._async import acreate_table, afence_gate, afenced_update, agated_execute
from ._gate import DEFAULT_TABLE
from ._sync import create_table, fence_gate, fenced_update, gated_execute

__all__ = [
    "DEFAULT_TABLE",
    "StaleFence",
    "acreate_table",
    "afence_gate",
    "afenced_update",
    "agated_execute",
    "create_table",
    "fence_gate",
    "fenced_update",
    "gated_execute",
]

for _name in __all__:
    _public = globals()[_name]
    if callable(_public) and _public is not StaleFence:  # (redlease.StaleFence is its name)
        _public.__module__ = __name__
del _name, _public

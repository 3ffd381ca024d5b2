"""The asyncio flavour, and the source of the blocking one.

Every module here but ``backend`` and ``renewer`` is written once, as asyncio code, and
``scripts/unasync.py`` generates its blocking twin in ``_sync`` by words alone. What
differs between tasks and threads beyond those words is in ``backend`` (under the names
``_sync.backend`` gives it too); the renewer is written by hand on each side, as its
design differs. Code that only asyncio has is marked ``# unasync: async only``.
"""

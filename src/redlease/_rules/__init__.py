"""The rules, without I/O: everything redlease decides, as plain code and generators.

Keys, the Lua scripts, the operations a flow yields (``ops``), argument checks, the ACL
rule, the classification of every server and client error (``classify``), the
single-server flows and the Redlock rules (``flows``, ``quorum``), lease state and the
renewal schedule, and what each primitive decides without talking to a server
(``front``, ``decorate``, ``rwlock``, ``election``, ``multilock``, ``redlock``, ``once``,
``fenced``, ``inspect``).

What does not belong here: sockets, threads, tasks, sleeping, anything that waits (a test
checks that no module here imports ``socket``, ``threading`` or ``asyncio``). The rules
use the foundation (``_base``) alone: never a client family (what a client's error is,
the driver says on the BackendError it builds), the wire or a flavour.
"""

"""The wire: the bytes between redlease and a server, for both flavours.

RESP out and in, the one read step and polling a socket before sleeping (``resp``),
dropping replies nobody waits for (``stale``), how to reach the server behind a client
(``endpoint``) and a failure as a caller sees it (``errors``). What does not belong here: waiting in
a flavour's way (the backends), or deciding anything about a lock (the rules).
"""

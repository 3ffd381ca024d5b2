"""The wire: the bytes between redlease and a server, for both flavours.

RESP encoding and the readers (``resp``), the one read step (``reading``), polling a
socket before sleeping (``spin``), dropping replies nobody waits for (``stale``), and how
to reach the server behind a client (``endpoint``). What does not belong here: waiting in
a flavour's way (the backends), or deciding anything about a lock (the rules).
"""

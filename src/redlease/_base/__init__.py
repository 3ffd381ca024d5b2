"""The foundation: what every other layer may use and that uses nothing of redlease's.

The error tree, the fork bookkeeping (and its thread lock that a child gets anew), the
version, the clock seam and timing arithmetic, the misuse guard of asyncio objects, and
the metrics. Nothing here knows of servers, clients, locks or I/O flavours.
"""

"""The foundation: what every other layer may use and that uses nothing of redlease's.

The error tree, the fork bookkeeping (and its thread lock that a child gets anew), the
threads redlease starts (blocking the process's signals), the version, the clock seam
and timing arithmetic, the types public signatures name, the misuse guard of asyncio
objects, and the metrics. Nothing here knows of servers, clients, locks or I/O flavours.
"""

import logging

# A library's loggers print nothing of their own accord: the application configures
# logging (the "redlease" tree) if it wants to see them. Set here, where every module
# that logs passes, and not in the package's ``__init__``: the command handles signals
# from its first instruction, before logging is imported.
logging.getLogger("redlease").addHandler(logging.NullHandler())

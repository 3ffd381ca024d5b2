"""The ``redlease`` command: its arguments and exit codes (``command``), what every
subcommand shares (``common``), ``run`` (a command under a lease) and the operator's
subcommands (``operate``). It uses the public API and the blocking flavour; nothing in
the library imports it.
"""

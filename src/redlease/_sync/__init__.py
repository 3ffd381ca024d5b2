"""The blocking flavour: generated from ``_async`` (do not edit those files), except
``backend`` and ``renewer``, written by hand: what threads do where ``_async.backend``
and ``_async.renewer`` use tasks."""

"""A griffe extension for the API reference: leave parameters whose names start with an
underscore out of the signatures shown. They are seams for redlease's own fault harness
(``Redlock(_rules=...)``), not part of the public surface."""

from __future__ import annotations

from typing import Any

import griffe


class HidePrivateParameters(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for parameter in list(func.parameters):
            if parameter.name.startswith("_") and not parameter.name.startswith("__"):
                del func.parameters[parameter.name]

"""The package as published: one version source, and a public API without test-only
switches (arguments or names that only the test suite or the fault harness should use)."""

from __future__ import annotations

import importlib.metadata
import inspect

import redlease


def test_one_version_source() -> None:
    assert redlease.__version__ == importlib.metadata.version("redlease")


def test_no_test_only_switches_in_the_public_api() -> None:
    for name in redlease.__all__:
        assert not name.startswith("_") or name == "__version__", name
        obj = getattr(redlease, name)
        if not inspect.isclass(obj):
            continue
        for attr, member in inspect.getmembers(obj):
            if attr.startswith("_") and attr != "__init__":
                continue
            if not callable(member):
                continue
            try:
                signature = inspect.signature(member)
            except (TypeError, ValueError):
                continue
            private = [p for p in signature.parameters if p.startswith("_")]
            assert not private, f"{name}.{attr} takes {private}"

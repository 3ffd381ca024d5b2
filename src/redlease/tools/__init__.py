"""What redlease ships beside the library: the demo (``redlease demo``), the
fault-injection harness (``redlease chaos``, ``python -m redlease.tools.chaos``), the
deliberately broken locks both of them run, and the launcher of private server processes
they, the benchmarks and the tests use. Nothing in the library imports this package."""

"""redlease's benchmarks: every figure measured side by side in one run.

Run ``python -m benchmarks`` from the repository root (``--help`` lists the options). It
starts its own private servers, runs every contender in interleaved rounds and prints one
table of ratios. See ``benchmarks/README.md`` for what each figure means.
"""

"""``python -m benchmarks``: run the benchmarks and print the table."""

from benchmarks.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

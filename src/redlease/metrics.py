"""redlease's metrics, through OpenTelemetry (``pip install 'redlease[otel]'``).

Without ``opentelemetry-api`` installed nothing is imported or recorded. With it, locks
record to the global meter provider, as OpenTelemetry libraries do, from their first
acquire: with an SDK configured (``opentelemetry.metrics.set_meter_provider``) that is
all it takes for the counters. ``configure`` adds the wait and hold durations (two
histograms, off by default for what they cost), picks another provider, adds lock names
to the attributes, or switches recording off. Durations reach the SDK a little later
than they happen (a background thread hands them over within a second, and each
collection takes those waiting first); ``flush`` hands them over now. What is recorded, and where:
docs/design.md, "Metrics and logs".
"""

from ._base.metrics import configure, enabled, flush

__all__ = ["configure", "enabled", "flush"]

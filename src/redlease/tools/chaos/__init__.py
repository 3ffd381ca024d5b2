"""Evidence that the lock excludes: workloads run by several processes against real
servers, with faults injected, and a checker that looks for what went wrong."""

"""Benchmarks: scripts that print figures (they never assert); see docs/performance.md."""

"""What the benchmarks share: result records, timing, kernel tables and reports, busy neighbours."""

"""What the benchmarks share: scratch databases and settings (scratch), servers on loopback (servers),
and the crash trial of bench.webhook (crash)."""

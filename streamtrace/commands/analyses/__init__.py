"""The analyses behind analyze, one module per analysis."""

"""Benchmarks that return plain dicts (the CLI and CI print or log them; nothing here prints)."""

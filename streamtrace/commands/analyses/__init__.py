"""The analyses behind ``analyze``, one module per analysis, and what they share."""

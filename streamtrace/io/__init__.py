"""Bytes in and out: sources and decompression, the event reader and its
repairs, the spool between the passes, writers and sinks, text-level field
splicing, progress lines.  Imports nothing above it (``engine``,
``commands``) and no algorithm."""

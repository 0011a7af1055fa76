"""One module per command: each wires an index visitor and an emit plan to
the engine and returns the summary.  Only the CLI and the package's face
(``streamtrace/__init__.py``) import these; commands may build on each other
(``merge`` compacts each rank)."""

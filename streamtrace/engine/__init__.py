"""The two passes every command runs on (index, then emit), the spool
between them, and the rereading when a parser needs a stricter mode."""

"""``python -m streamtrace``."""
from .cli import main

raise SystemExit(main())

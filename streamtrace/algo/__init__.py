"""Pure algorithms over typed arrays and small records: lanes, PP blocks and
arrows, rank rules, id tables, enclosure, id scheme, rules.  No I/O: these
modules import nothing from ``io``, ``engine`` or ``commands``."""

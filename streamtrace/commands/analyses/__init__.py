"""The analyses ``analyze`` runs beside HTA's tables, one module per analysis: what it
collects in pass 1, how it makes its tables from the ranks' results, and how it writes them."""

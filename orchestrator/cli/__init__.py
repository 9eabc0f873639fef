"""The `plait` command line."""

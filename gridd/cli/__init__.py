"""Command-line entry points: ``gridd`` (the daemon) and ``gridctl`` (the client)."""

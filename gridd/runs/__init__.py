"""Runs: the process layer. The executor seam, the per-agent supervisor (shim), the process
handle the daemon keeps, and the bundled example agent. Kept import-light: the shim runs
with ``python -I -S``."""

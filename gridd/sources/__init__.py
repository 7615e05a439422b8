"""Where tasks come from besides the API: beads (``bd``)."""

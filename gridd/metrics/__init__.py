"""Metrics, one concept: the bus-fed counters and the scrape-time feed (``feed``), their
Prometheus rendering loaded at the first scrape (``export``), and one daemon's metrics
(``daemon``), which ``GET /metrics`` serves. Imports nothing itself: a daemon nobody scrapes
never loads prometheus-client."""

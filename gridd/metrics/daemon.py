"""One daemon's metrics: the bus-fed event counter and the request stats, kept from the
start, and their Prometheus rendering, loaded at the first scrape (see ``gridd.metrics.feed``)."""

from __future__ import annotations

from collections.abc import Callable

from gridd.metrics.feed import EventCounter, MetricsSource, RequestStats


class DaemonMetrics:
    """One daemon's metrics: the event counter and request stats now, the registry (and
    prometheus-client) at the first scrape."""

    def __init__(self, source: MetricsSource, *, events: EventCounter | None = None) -> None:
        self.source = source
        #: Built before the pool by the composition root, which times runs' finishes with it.
        self.events = events or EventCounter()
        self.requests = RequestStats()
        self._render: Callable[[], bytes] | None = None
        source.bus.add_listener(self.events)

    def render(self) -> bytes:
        """The text exposition of every metric (builds the registry on first use)."""
        if self._render is None:
            from gridd.metrics.export import renderer

            self._render = renderer(self.source, self.events, self.requests)
        return self._render()

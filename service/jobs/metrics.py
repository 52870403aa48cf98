"""Prometheus metrics of one replica, in a registry of its own (one per app).

Request latency and cache hits/misses are counted by the API; solve seconds and finished jobs by the
job runner; jobs by state and the queue depth are read from the store at each scrape (they are shared by
all replicas of one database).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SOLVE_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "autoshard_http_request_duration_seconds",
            "HTTP request latency, seconds",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.solve_seconds = Histogram(
            "autoshard_solve_seconds",
            "Wall time of a job's work in its worker process, seconds",
            ["kind"],
            buckets=SOLVE_BUCKETS_S,
            registry=self.registry,
        )
        self.jobs_finished = Counter(
            "autoshard_jobs_finished",
            "Jobs this replica finished, by outcome",
            ["state"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "autoshard_plan_cache_hits",
            "Submissions answered from a stored result",
            ["kind"],
            registry=self.registry,
        )
        self.cache_misses = Counter(
            "autoshard_plan_cache_misses", "Submissions that needed a job", ["kind"], registry=self.registry
        )

    def watch_store(self, counts_by_state: Callable[[], dict[str, int]]) -> None:
        """Report jobs by state and the queue depth from ``counts_by_state`` at each scrape."""
        self.registry.register(_JobStateCollector(counts_by_state))


class _JobStateCollector(Collector):
    def __init__(self, counts_by_state: Callable[[], dict[str, int]]) -> None:
        self.counts_by_state = counts_by_state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.counts_by_state()
        by_state = GaugeMetricFamily("autoshard_jobs", "Jobs in the store, by state", labels=["state"])
        for state, count in sorted(counts.items()):
            by_state.add_metric([state], count)
        yield by_state
        yield GaugeMetricFamily("autoshard_queue_depth", "Queued jobs", value=counts.get("queued", 0))

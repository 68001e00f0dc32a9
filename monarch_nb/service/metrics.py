"""``ServiceMetrics``: what ``Service.get_metrics()`` returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServiceMetrics:
    """Per replica (``Replica.metrics()``: state, requests, failed, in flight, latency
    p50/p99 in seconds, restarts, last failure, and ``pids``: its live procs' while it is
    healthy, none otherwise), and for the service: open sessions, requests waiting for
    a replica (none healthy yet), requests sent again to another replica after theirs
    died under them (``retried``), and requests whose caller got an error (``failed``:
    a batch counts each of its requests, also when its results were not one per
    request)."""

    service: str
    replicas: list[dict]
    sessions: int
    waiting: int
    retried: int
    failed: int

    def table(self) -> str:
        """The replicas as a plain-text table (latencies in ms)."""
        head = (f"{'replica':>7} {'state':<12} {'requests':>8} {'failed':>6} {'in flight':>9} "
                f"{'p50 ms':>8} {'p99 ms':>8} {'restarts':>8}")
        rows = [f"{r['replica']:>7} {r['state']:<12} {r['requests']:>8} {r['failed']:>6} {r['in_flight']:>9} "
                f"{r['latency_p50_s'] * 1e3:>8.2f} {r['latency_p99_s'] * 1e3:>8.2f} {r['restarts']:>8}"
                for r in self.replicas]
        tail = f"sessions {self.sessions}, waiting {self.waiting}, retried {self.retried}, failed {self.failed}"
        return "\n".join([f"service {self.service}", head, *rows, tail])

    def __str__(self) -> str:
        return self.table()

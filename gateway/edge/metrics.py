"""Prometheus metrics, served at GET /metrics: one registry per app, no module-level state.

On the request path each call costs a counter and two histogram observations (a few
microseconds); the writer observes each commit's batch size and time. What lives in the store
(trajectories and groups by state, trainer steps, rewards) is read from it when /metrics is
scraped (``store/stats.py``), so every gateway on one PostgreSQL reports the same totals and the trainer, a
separate process, needs no exporter of its own.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from burnish_server.store.stats import StoreState

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# A commit on SQLite takes under a millisecond: finer at the bottom than the calls' latency.
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("burnish_requests", "Proxied calls, by endpoint and HTTP status", ["endpoint", "status"], registry=r)
        self.added = Histogram(
            "burnish_added_latency_seconds", "Time the gateway added to a call: its whole time less the upstream's", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.upstream = Histogram(
            "burnish_upstream_latency_seconds", "Upstream time of a call, from sending to its last byte", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._requests: dict[tuple[str, int], Any] = {}
        self._timings: dict[str, tuple[Any, Any]] = {}
        self.record_queue = Gauge("burnish_record_queue", "Records and changes waiting for the store writer", registry=r)
        # The proxy's connection pool (gateway/upstream/connections/http1.py): in use and idle, and the replicas it knows.
        self.upstream_connections = Gauge("burnish_upstream_connections", "Connections to the upstream's replicas, by state", ["state"], registry=r)
        self.upstream_origins = Gauge("burnish_upstream_origins", "Upstream origins (replicas) the connection pool holds connections to", registry=r)
        self.commit_batch = Histogram("burnish_commit_batch_size", "Records written per group commit", buckets=BATCH_BUCKETS, registry=r)
        self.commit_seconds = Histogram(
            "burnish_commit_seconds", "Seconds each group commit took, retries included: the store's write latency",
            buckets=COMMIT_BUCKETS, registry=r,
        )  # fmt: skip
        self.trajectories = Gauge("burnish_trajectories", "Trajectories in the store, by state", ["state"], registry=r)
        self.groups = Gauge("burnish_groups", "Groups in the store, by policy and state", ["policy", "state"], registry=r)
        self.steps = Gauge("burnish_trainer_steps", "Training steps recorded, by policy", ["policy"], registry=r)
        self.step_seconds = Gauge("burnish_trainer_step_seconds", "Seconds the policy's last step took (claim to checkpoint)", ["policy"], registry=r)
        self.reward = Gauge("burnish_policy_reward_mean", "Mean reward of the groups of the policy's last step", ["policy"], registry=r)
        # Held-out scores (store/evals.py), per policy for the base, the served and the newest few versions only.
        self.eval_score = Gauge(
            "burnish_eval_score", "Mean reward of the rewarded eval (held-out) trajectories a policy version answered", ["policy", "step"], registry=r
        )
        self.splits = Gauge(
            "burnish_sequence_splits",
            "Calls whose prompt did not extend their trajectory, in the steps trained so far, by reason (core/learning/drift.py)",
            ["policy", "reason"],
            registry=r,
        )
        # Promotion (store/promotion.py): decisions so far by kind, and the version on trial (-1: none).
        self.decisions = Gauge("burnish_policy_decisions", "Versions of the policy promoted, rejected or rolled back", ["policy", "decision"], registry=r)
        self.candidate = Gauge("burnish_policy_candidate_step", "The policy's version on trial (-1 when none)", ["policy"], registry=r)
        self.served = Gauge("burnish_policy_served_step", "The policy's version served", ["policy"], registry=r)
        self.eval_trajectories = Gauge(
            "burnish_eval_trajectories", "Rewarded eval (held-out) trajectories a policy version answered", ["policy", "step"], registry=r
        )

    def observe_call(self, endpoint: str, status: int, total_s: float, upstream_s: float | None) -> None:
        # The labelled series, looked up once each: ``labels()`` takes a lock and builds a key (~0.007 ms).
        requests = self._requests.get((endpoint, status))
        if requests is None:
            requests = self._requests[endpoint, status] = self.requests.labels(endpoint, str(status))
        requests.inc()
        if upstream_s is not None:
            timings = self._timings.get(endpoint)
            if timings is None:
                timings = self._timings[endpoint] = (self.upstream.labels(endpoint), self.added.labels(endpoint))
            timings[0].observe(upstream_s)
            timings[1].observe(max(total_s - upstream_s, 0.0))

    def set_store_state(self, state: StoreState) -> None:
        gauges = (self.trajectories, self.groups, self.steps, self.step_seconds, self.reward, self.eval_score, self.eval_trajectories, self.splits)
        for gauge in (*gauges, self.decisions, self.candidate, self.served):
            gauge.clear()  # a policy or state that vanished must not linger
        for name, count in state.trajectories.items():
            self.trajectories.labels(name).set(count)
        for (policy, name), count in state.groups.items():
            self.groups.labels(policy or "", name).set(count)
        for policy, last in state.steps.items():
            self.steps.labels(policy).set(last.steps)
            if last.seconds is not None:
                self.step_seconds.labels(policy).set(last.seconds)
            if last.reward is not None:
                self.reward.labels(policy).set(last.reward)
        for policy, reasons in state.splits.items():
            for reason, count in reasons.items():
                self.splits.labels(policy, reason).set(count)
        for (policy, step), (count, score) in state.evals.items():
            self.eval_trajectories.labels(policy, str(step)).set(count)
            self.eval_score.labels(policy, str(step)).set(score)
        for (policy, decision), count in state.decisions.items():
            self.decisions.labels(policy, decision).set(count)
        for policy, versions in state.versions.items():
            self.served.labels(policy).set(versions.served)
            self.candidate.labels(policy).set(-1 if versions.candidate is None else versions.candidate)

    def render(self) -> bytes:
        return generate_latest(self.registry)

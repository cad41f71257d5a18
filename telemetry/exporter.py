"""What every exporter is: a bounded queue the caller puts on without waiting, and one thread
that takes from it and talks to the outside (Langfuse, the trackers' packages).

So a slow or unreachable service never holds up a request or a training step: when the queue
is full the item is dropped and counted (``on_dropped``), never waited for. The thread is the
only one that uses the service's client, so no client need be thread-safe.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

T = TypeVar("T")

# How long the thread waits for an item before it looks whether it is asked to stop.
POLL_S = 0.25


class Exporter(ABC, Generic[T]):
    def __init__(self, name: str, queue_size: int) -> None:
        self.queue: queue.Queue[T] = queue.Queue(maxsize=queue_size)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread: by the subclass, once its own fields are set."""
        self.thread.start()

    def put(self, item: T) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.on_dropped(item)

    def take(self, timeout_s: float = POLL_S) -> T | None:
        """The next item, or None if none came within ``timeout_s``."""
        try:
            return self.queue.get(timeout=timeout_s) if timeout_s > 0 else self.queue.get_nowait()
        except queue.Empty:
            return None

    def stop(self, timeout_s: float) -> bool:
        """Ask the thread to finish what is queued and end; whether it did within ``timeout_s``."""
        self.stopping.set()
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    @abstractmethod
    def run(self) -> None:
        """The thread: take items until ``stopping`` is set and nothing is left."""

    @abstractmethod
    def on_dropped(self, item: T) -> None:
        """The queue was full: ``item`` is not sent. Count it, say so."""

"""Searches in forked processes, a core each, that send their answers to this process while they run.

`ForkedSearch` runs a function in a forked process (it needs the fork start method: `can_fork`) and hands it
a `Channel`: the search reports each better answer with `Channel.found` (sent at most every
`SEND_INTERVAL_S`: an answer of a 40,000-node problem is 320 KB and a heuristic improves many times a
second) and asks `Channel.halted` between steps. This process reads its answers with `ForkedSearch.poll`
and ends it with `ForkedSearch.stop`, which returns the best it sent.

(A second search around the memory peak in a forked process, trading answers both ways with the one here,
was measured on IOPDDL K at 60 s: 3.24e9 and 3.34e9 against 2.78e9 alone; on V it found nothing the one here
did not. Not kept.)
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import time
import weakref
from collections.abc import Callable

import numpy as np

#: A search sends its best answer at most this often.
SEND_INTERVAL_S = 0.25
#: How long a search told to stop may take to send its last answer.
FINAL_ANSWER_WAIT_S = 2.0

Answer = tuple[float, np.ndarray]


def can_fork() -> bool:
    """Whether forked searches can run here: a platform that forks, and a process that may have children (a
    daemon, as the service's job workers are, may not: its searches run in it)."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


class Channel:
    """The forked search's side: send answers, know when to stop."""

    def __init__(self, outbox: multiprocessing.Queue, halt: object) -> None:
        self._outbox, self._halt = outbox, halt
        self._pending: Answer | None = None
        self._sent_at = -math.inf

    def found(self, cost: float, assignment: np.ndarray) -> None:
        """A better answer: sent now, or with the next call once `SEND_INTERVAL_S` has passed."""
        self._pending = (cost, assignment)
        self._send_due()

    def halted(self) -> bool:
        """Whether this process was told to stop (asked between steps; sends an answer that waits)."""
        self._send_due()
        return bool(self._halt.is_set())  # type: ignore[attr-defined]

    def finish(self, answer: Answer | None) -> None:
        self._pending = None
        if answer is not None:
            self._outbox.put(answer)
        self._outbox.put(None)

    def _send_due(self) -> None:
        if self._pending is not None and time.monotonic() - self._sent_at >= SEND_INTERVAL_S:
            self._outbox.put(self._pending)
            self._pending, self._sent_at = None, time.monotonic()


class ForkedSearch:
    """``run(channel)`` in a forked process; it returns its best answer (cost, assignment) or None."""

    def __init__(self, run: Callable[[Channel], Answer | None]) -> None:
        context = multiprocessing.get_context("fork")
        self._outbox: multiprocessing.Queue = context.Queue()
        self._halt = context.Event()
        channel = Channel(self._outbox, self._halt)
        self._process = context.Process(target=_run_forked, args=(run, channel), daemon=True)
        self._process.start()
        # dropped without `stop` (an exception unwound the caller): the search is still told to stop
        weakref.finalize(self, self._halt.set)
        self._ended = False
        self.cost = math.inf
        self.best: np.ndarray | None = None

    def poll(self) -> Answer | None:
        """The search's best answer when it sent a cheaper one since the last call, else None."""
        improved = False
        for message in _drain(self._outbox):
            improved |= self._take(message)
        return (self.cost, self.best) if improved and self.best is not None else None

    def stop(self) -> Answer | None:
        """Stop the search; the best answer it sent (None when none)."""
        if not self._ended:
            self._halt.set()
            deadline = time.monotonic() + FINAL_ANSWER_WAIT_S
            while not self._ended and time.monotonic() < deadline:
                try:
                    self._take(self._outbox.get(timeout=max(0.01, deadline - time.monotonic())))
                except queue.Empty:
                    break
            self._ended = True
        # Reaped even when the search had ended on its own (its last message read by `poll`): it may still be
        # on its way out, and no process outlives `stop`. A child forked while another thread held a lock (a
        # process group's, the allocator's) can hang on its way out: ended here.
        self._process.join(timeout=0.5)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=1.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        return None if self.best is None else (self.cost, self.best)

    def _take(self, message: Answer | None) -> bool:
        if message is None:  # the search ended
            self._ended = True
            return False
        cost, assignment = message
        if cost < self.cost:
            self.cost, self.best = cost, assignment
            return True
        return False


def _run_forked(run: Callable[[Channel], Answer | None], channel: Channel) -> None:
    channel.finish(run(channel))


def _drain(box: multiprocessing.Queue) -> list:
    messages = []
    while True:
        try:
            messages.append(box.get_nowait())
        except queue.Empty:
            return messages


__all__ = ["Answer", "Channel", "ForkedSearch", "can_fork"]

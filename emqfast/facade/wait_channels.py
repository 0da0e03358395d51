"""Which waits listen on which done channel: the bookkeeping both wait registries share
(the sync reader thread, :mod:`emqfast.facade.wait_reader`, and the asyncio reader task,
:mod:`emqfast.aio.job_wait`). No I/O here: the registries send the SUBSCRIBE/UNSUBSCRIBE
this book asks for and feed it the replies and messages their connection reads.

A channel is subscribed once however many waits want it. A wait joining a channel whose
SUBSCRIBE Redis already confirmed is confirmed at once; otherwise it is confirmed with the
others when the reply comes (a channel re-subscribed while an earlier SUBSCRIBE is still on
its way is confirmed by the last reply only).
"""
from __future__ import annotations

import time
from typing import Dict, Generic, List, Optional, Set, Tuple, TypeVar

class Liveness:
    """Whether a quiet pub/sub connection still answers (a half-open one never says it is
    gone, and nothing else reads from it): after ``quiet_s`` without a message it is
    PINGed, and a PING unanswered ``deadline_s`` later means the connection is dead (the
    registry then re-opens it and every wait re-reads its jobs)."""

    def __init__(self, quiet_s: float, deadline_s: float):
        self.quiet_s, self.deadline_s = quiet_s, deadline_s
        self.heard = time.monotonic()
        self.pinged: Optional[float] = None

    def heard_now(self) -> None:
        """Something arrived: the connection is alive."""
        self.heard, self.pinged = time.monotonic(), None

    def due(self) -> str:
        """``"dead"``, ``"ping"`` (then :meth:`sent_ping`) or ``""``."""
        now = time.monotonic()
        if self.pinged is not None:
            return "dead" if now - self.pinged > self.deadline_s else ""
        return "ping" if now - self.heard >= self.quiet_s else ""

    def sent_ping(self) -> None:
        self.pinged = time.monotonic()

    def next_check_s(self) -> float:
        """Seconds until :meth:`due` may say something new."""
        now = time.monotonic()
        if self.pinged is not None:
            return max(0.0, self.pinged + self.deadline_s - now) + 0.01
        return max(0.0, self.heard + self.quiet_s - now) + 0.01


W = TypeVar("W")  # a waiter: anything the registry hands confirmations and messages to


class ChannelBook(Generic[W]):
    """The waiters per channel and the SUBSCRIBE replies still to come per channel."""

    def __init__(self) -> None:
        self.chans: Dict[bytes, List[W]] = {}
        self._due: Dict[bytes, int] = {}  # channel -> SUBSCRIBE replies still to come

    def __bool__(self) -> bool:
        """True while some wait listens on some channel."""
        return bool(self.chans)

    def idle(self) -> bool:
        """True when no wait listens and no SUBSCRIBE reply is still to come."""
        return not self.chans and not self._due

    def add(self, waiter: W, channels: List[bytes]) -> Tuple[List[bytes], List[bytes]]:
        """``waiter`` joins ``channels``: ``(to subscribe, already confirmed)``."""
        new, ready = [], []
        for ch in channels:
            if ch in self.chans:
                self.chans[ch].append(waiter)
                if not self._due.get(ch):
                    ready.append(ch)
            else:
                self.chans[ch] = [waiter]
                self._due[ch] = self._due.get(ch, 0) + 1
                new.append(ch)
        return new, ready

    def remove(self, waiter: W, channels: List[bytes]) -> List[bytes]:
        """``waiter`` leaves ``channels``: those nobody listens on any more (to unsubscribe;
        a message on them meanwhile finds no waiter)."""
        gone = []
        for ch in channels:
            waiters = self.chans.get(ch)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self.chans[ch]
                    gone.append(ch)
        return gone

    def resubscribed(self) -> Dict[bytes, List[W]]:
        """A new connection subscribes to every channel again: each one's reply is due
        once more. Returns the channels with their waiters (a copy)."""
        self._due = {ch: 1 for ch in self.chans}
        return {ch: list(ws) for ch, ws in self.chans.items()}

    def waiters(self) -> Set[W]:
        """Every waiter, once."""
        return {w for ws in self.chans.values() for w in ws}

    def confirmed(self, ch: bytes) -> List[W]:
        """A SUBSCRIBE reply for ``ch``: the waiters to confirm now (none while a later
        SUBSCRIBE of it is still on its way)."""
        if self._due.get(ch):
            self._due[ch] -= 1
            if self._due[ch]:
                return []
            del self._due[ch]  # (no entry per channel ever waited on)
        return list(self.chans.get(ch, ()))

    def listeners(self, ch: bytes) -> List[W]:
        """The waiters a message on ``ch`` goes to."""
        return list(self.chans.get(ch, ()))

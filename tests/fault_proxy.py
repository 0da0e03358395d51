"""A loopback TCP fault proxy: put it between emqfast's clients and a real redis-server.

No dependencies beyond the standard library; it listens on 127.0.0.1 only and
forwards to a server on 127.0.0.1 only. One thread accepts, two threads pump
each connection (client->server "c2s", server->client "s2c").

API (all methods are thread-safe)::

    from fault_proxy import FaultProxy

    with FaultProxy(upstream_port=6379, seed=7) as proxy:   # started; stops on exit
        url = proxy.url()          # "redis://127.0.0.1:<proxy port>/0": give it to the client
        proxy.cut("s2c")           # next reply chunk on a random live connection is cut at a
                                   # random byte: the server RAN the command, its reply is lost
        proxy.cut("c2s")           # next request chunk is cut at a random byte: the server
                                   # sees half a command (Redis discards it) and a closed socket
        proxy.cut("any")           # either direction (decided by the seeded RNG)
        proxy.cut_after(12)        # forward exactly 12 more reply bytes (over all connections),
                                   # then close the one that carried the last: precise cuts
                                   # ("the 3rd reply of this pipeline is lost"); None disarms
        proxy.hold(0.5)            # the next reply on a random live connection comes 0.5 s
                                   # late (past a client's socket timeout: a stale reply)
        proxy.reset()              # RST (SO_LINGER 0) a random live connection now
        proxy.cut_all()            # close every live connection now (FIN both sides)
        proxy.delay(0.05)          # add 50 ms before forwarding every chunk (0: off)
        proxy.pause()              # hold new connections (accepted, not forwarded) ...
        proxy.resume()             # ... until resume; pause(drop=True) closes them instead
        proxy.half_open()          # every live connection goes silent for good: its bytes are
                                   # swallowed both ways, no FIN, no RST (a NAT or link blip);
                                   # new connections work at once
        proxy.blackhole()          # the same for every connection, new ones included (they
                                   # are accepted, then silent), until ...
        proxy.heal()               # ... new connections work again (silenced ones stay dead)
        run = proxy.chaos(duration_s=10, gap_s=(0.05, 0.2))   # background: every 50-200 ms
        run.stop(); run.join()     # cut a random live connection ("c2s"/"s2c"/"rst", or
                                   # "hold" a reply hold_s); bounded
        proxy.stats                # Counter: accepted, cut_c2s, cut_s2c, reset, ...
        proxy.live()               # number of live proxied connections

``cut(direction, timeout_s=0.5)`` arms a cut on one live connection (chosen by the
seeded RNG); it fires on the next chunk flowing that way. If no chunk flows within
``timeout_s`` (an idle pooled connection, a client blocked in BZPOPMIN), the
connection is closed outright when the timeout passes, so a cut never lingers.
It returns False when there was no live connection to cut.

Determinism: every random choice (which connection, where to cut, the gap between
chaos cuts, the direction) comes from ``random.Random(seed)``; thread scheduling
still decides which bytes are in flight, so a run is reproducible in its choices,
not byte for byte.

Bounds: every loop polls with a short timeout and checks a stop flag; a chaos run
stops after ``duration_s`` or ``max_cuts``; the whole proxy stops by itself after
``max_lifetime_s`` (default 600 s) even if nobody calls :meth:`stop`.
"""
from __future__ import annotations

import random
import select
import socket
import struct
import threading
import time
from collections import Counter
from typing import Dict, Optional, Sequence, Tuple

LOOPBACK = "127.0.0.1"
_CHUNK = 65536
_POLL_S = 0.05


def _rst_close(sock: socket.socket) -> None:
    """Close ``sock`` with an RST instead of a FIN (SO_LINGER on, 0 s)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Link:
    """One proxied connection: the client socket, the upstream socket, armed cuts."""

    def __init__(self, proxy: "FaultProxy", cid: int, client: socket.socket,
                 upstream: socket.socket):
        self.proxy, self.cid = proxy, cid
        self.client, self.upstream = client, upstream
        self.armed: Dict[str, float] = {}  # direction -> monotonic deadline of the cut
        self.holds: Dict[str, float] = {}  # direction -> seconds to hold its next chunk
        self.closed = threading.Event()
        self.silent = False  # half-open: its bytes are swallowed, it is never closed
        self._lock = threading.Lock()

    def start(self) -> None:
        for direction, src, dst in (("c2s", self.client, self.upstream),
                                    ("s2c", self.upstream, self.client)):
            threading.Thread(target=self._pump, args=(direction, src, dst), daemon=True,
                             name=f"fault-proxy-{self.cid}-{direction}").start()

    def arm(self, direction: str, timeout_s: float) -> None:
        with self._lock:
            self.armed[direction] = time.monotonic() + timeout_s

    def close(self, rst: bool = False) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        (_rst_close if rst else _close)(self.client)
        _close(self.upstream)
        self.proxy._forget(self)

    def hold_next(self, direction: str, seconds: float) -> None:
        with self._lock:
            self.holds[direction] = seconds

    def _take_hold(self, direction: str) -> float:
        with self._lock:
            return self.holds.pop(direction, 0.0)

    def _take_armed(self, direction: str) -> Optional[float]:
        with self._lock:
            return self.armed.pop(direction, None)

    def _overdue(self) -> bool:
        with self._lock:
            now = time.monotonic()
            return any(deadline < now for deadline in self.armed.values())

    def _pump(self, direction: str, src: socket.socket, dst: socket.socket) -> None:
        proxy = self.proxy
        try:
            while not self.closed.is_set() and not proxy._stopped.is_set():
                if self._overdue():  # armed, but nothing flowed: cut the idle connection
                    proxy._count("cut_idle")
                    self.close()
                    return
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready:
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                if self.silent:  # swallowed: the peer hears nothing, not even a close
                    proxy._count(f"swallowed_{direction}", len(data))
                    continue
                allowed = proxy._spend(direction, len(data))
                if allowed is not None:  # cut_after: exactly `allowed` more bytes, then cut
                    if allowed:
                        dst.sendall(data[:allowed])
                    proxy._count(f"cut_after_{direction}")
                    self.close()
                    return
                if self._take_armed(direction) is not None:
                    at = proxy._randrange(len(data))  # 0 .. len-1: never the whole chunk
                    if at:
                        dst.sendall(data[:at])
                    proxy._count(f"cut_{direction}")
                    proxy._count(f"cut_{direction}_bytes", at)
                    self.close()
                    return
                held = self._take_hold(direction)
                if held:  # one late chunk: the client may time out; the bytes still come
                    proxy._count(f"held_{direction}")
                    if self.closed.wait(held) or proxy._stopped.is_set():
                        break
                if proxy._delay_s:
                    time.sleep(proxy._delay_s)
                dst.sendall(data)
                proxy._count(f"bytes_{direction}", len(data))
        except OSError:
            pass
        self.close()


class ChaosRun:
    """A background run of cuts at random gaps; stops by itself (duration, max cuts)."""

    def __init__(self, proxy: "FaultProxy", duration_s: float, gap_s: Tuple[float, float],
                 faults: Sequence[str], max_cuts: int, hold_s: float = 1.0):
        self.proxy, self.duration_s, self.gap_s = proxy, duration_s, gap_s
        self.hold_s = hold_s
        self.faults, self.max_cuts = tuple(faults), max_cuts
        self.cuts: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fault-proxy-chaos")

    def start(self) -> "ChaosRun":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)

    @property
    def total(self) -> int:
        return sum(self.cuts.values())

    def _run(self) -> None:
        end = time.monotonic() + self.duration_s
        proxy = self.proxy
        while self.total < self.max_cuts and not self._stop.is_set():
            gap = proxy._uniform(*self.gap_s)
            if self._stop.wait(gap) or time.monotonic() > end or proxy._stopped.is_set():
                return
            fault = proxy._choice(self.faults)
            if fault == "rst":
                done = proxy.reset()
            elif fault == "hold":
                done = proxy.hold(self.hold_s)
            else:
                done = proxy.cut(fault)
            if done:
                self.cuts[fault] += 1


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>`` that injects
    faults on demand (see the module docstring for the API)."""

    def __init__(self, upstream_port: int, *, seed: int = 0, port: int = 0,
                 max_lifetime_s: float = 600.0):
        self.upstream = (LOOPBACK, int(upstream_port))
        self.seed = seed
        self.max_lifetime_s = max_lifetime_s
        self.stats: Counter = Counter()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._links: Dict[int, _Link] = {}
        self._links_lock = threading.Lock()
        self._next_id = 0
        self._delay_s = 0.0
        self._budgets: Dict[str, Optional[int]] = {"c2s": None, "s2c": None}
        self._accepting = threading.Event()
        self._accepting.set()
        self._drop_while_paused = False
        self._blackhole = False
        self._stopped = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, port))
        self._listener.listen(128)
        self._listener.settimeout(_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name="fault-proxy-accept")

    # --- lifecycle --------------------------------------------------------------
    def start(self) -> "FaultProxy":
        """Start accepting; returns self."""
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every live connection."""
        self._stopped.set()
        self._accepting.set()  # release held connections so their threads end
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._close_listener()
        self.cut_all(count_as="closed_at_stop")

    def _close_listener(self) -> None:
        try:
            self._listener.close()  # new connections are refused, not left in a backlog
        except OSError:
            pass

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, db: int = 0) -> str:
        """The ``redis://`` URL of the proxy (give it to the client under test)."""
        return f"redis://{LOOPBACK}:{self.port}/{db}"

    # --- faults -------------------------------------------------------------------
    def cut(self, direction: str = "any", timeout_s: float = 0.5) -> bool:
        """Arm a cut at a random byte of the next chunk flowing ``direction`` ('c2s',
        's2c' or 'any') on one random live connection. False if none is live."""
        if direction == "any":
            direction = self._choice(("c2s", "s2c"))
        if direction not in ("c2s", "s2c"):
            raise ValueError(f"direction must be c2s, s2c or any, not {direction!r}")
        link = self._pick()
        if link is None:
            return False
        link.arm(direction, timeout_s)
        self._count(f"armed_{direction}")
        return True

    def cut_after(self, nbytes: Optional[int], direction: str = "s2c") -> None:
        """Forward exactly ``nbytes`` more bytes ``direction`` (counted over every
        connection), then close the connection that carried the last of them. One-shot;
        ``None`` disarms. With 's2c' every request already sent has reached Redis."""
        if direction not in self._budgets:
            raise ValueError(f"direction must be c2s or s2c, not {direction!r}")
        with self._rng_lock:
            self._budgets[direction] = None if nbytes is None else max(0, int(nbytes))

    def hold(self, seconds: float, direction: str = "s2c") -> bool:
        """Hold the next chunk flowing ``direction`` on one random live connection for
        ``seconds``, then deliver it: with 's2c' longer than the client's socket timeout,
        the client gives up on a reply that still arrives later on that connection (a
        client that reuses the connection then reads a stale reply). False if none."""
        if direction not in ("c2s", "s2c"):
            raise ValueError(f"direction must be c2s or s2c, not {direction!r}")
        link = self._pick()
        if link is None:
            return False
        link.hold_next(direction, seconds)
        self._count(f"armed_hold_{direction}")
        return True

    def reset(self) -> bool:
        """Reset (RST) one random live connection now. False if none is live."""
        link = self._pick()
        if link is None:
            return False
        self._count("reset")
        link.close(rst=True)
        return True

    def cut_all(self, count_as: str = "cut_all") -> int:
        """Close every live connection now (FIN); returns how many."""
        with self._links_lock:
            links = list(self._links.values())
        for link in links:
            link.close()
        self._count(count_as, len(links))
        return len(links)

    def delay(self, seconds: float) -> None:
        """Hold every forwarded chunk ``seconds`` (both directions); 0 turns it off."""
        self._delay_s = max(0.0, float(seconds))

    def pause(self, drop: bool = False) -> None:
        """Stop serving new connections: held until :meth:`resume` (or closed at once
        with ``drop=True``). Live connections are untouched."""
        self._drop_while_paused = drop
        self._accepting.clear()

    def resume(self) -> None:
        """Serve new connections again (held ones are connected now)."""
        self._accepting.set()

    def half_open(self) -> int:
        """Silence every live connection for good: bytes either way are swallowed, nothing
        is closed (no FIN, no RST), as after a link or NAT blip; new connections work.
        Returns how many went silent."""
        with self._links_lock:
            links = list(self._links.values())
        for link in links:
            link.silent = True
        self._count("half_open", len(links))
        return len(links)

    def blackhole(self) -> int:
        """:meth:`half_open`, and every new connection is accepted and silent too, until
        :meth:`heal`. Returns how many live connections went silent."""
        self._blackhole = True
        return self.half_open()

    def heal(self) -> None:
        """New connections are forwarded again (silenced ones stay silent)."""
        self._blackhole = False

    def chaos(self, duration_s: float, gap_s: Tuple[float, float] = (0.05, 0.2),
              faults: Sequence[str] = ("c2s", "s2c", "rst"),
              max_cuts: int = 10_000, hold_s: float = 1.0) -> ChaosRun:
        """Start a background run: every ``gap_s`` (uniform) seconds one fault from
        ``faults`` ('c2s', 's2c', 'any', 'rst', 'hold': a reply held ``hold_s``) on a
        random live connection, until ``duration_s`` passed, ``max_cuts`` were made or
        :meth:`ChaosRun.stop`."""
        return ChaosRun(self, duration_s, gap_s, faults, max_cuts, hold_s).start()

    def live(self) -> int:
        """How many proxied connections are live now."""
        with self._links_lock:
            return len(self._links)

    # --- internals ----------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            if time.monotonic() - self._started > self.max_lifetime_s:
                self._stopped.set()  # stops by itself: no test can leave it running
                self._close_listener()
                self.cut_all(count_as="closed_at_lifetime")
                return
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True,
                             name="fault-proxy-connect").start()

    def _serve(self, client: socket.socket) -> None:
        # a paused proxy holds the connection (bounded by the proxy's own stop)
        while not self._accepting.wait(_POLL_S):
            if self._drop_while_paused or self._stopped.is_set():
                self._count("dropped_while_paused")
                _close(client)
                return
        if self._stopped.is_set():
            _close(client)
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            self._count("upstream_refused")
            _close(client)
            return
        upstream.settimeout(None)
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._links_lock:
            self._next_id += 1
            link = _Link(self, self._next_id, client, upstream)
            link.silent = self._blackhole
            self._links[link.cid] = link
        self._count("accepted")
        link.start()

    def _forget(self, link: _Link) -> None:
        with self._links_lock:
            self._links.pop(link.cid, None)

    def _pick(self) -> Optional[_Link]:
        with self._links_lock:
            links = [self._links[k] for k in sorted(self._links)]
        if not links:
            return None
        return self._choice(links)

    def _spend(self, direction: str, n: int) -> Optional[int]:
        """None: forward the ``n`` bytes. Else the armed budget ran out within them:
        forward that many and cut (the budget is disarmed)."""
        with self._rng_lock:
            budget = self._budgets[direction]
            if budget is None:
                return None
            if n < budget:
                self._budgets[direction] = budget - n
                return None
            self._budgets[direction] = None
            return budget

    def _count(self, what: str, n: int = 1) -> None:
        with self._rng_lock:
            self.stats[what] += n

    def _randrange(self, n: int) -> int:
        with self._rng_lock:
            return self._rng.randrange(n)

    def _uniform(self, lo: float, hi: float) -> float:
        with self._rng_lock:
            return self._rng.uniform(lo, hi)

    def _choice(self, seq: Sequence):  # type: ignore[no-untyped-def]
        with self._rng_lock:
            return self._rng.choice(list(seq))


def upstream_port_of(redis_url: str) -> int:
    """The port of a ``redis://127.0.0.1:<port>/...`` URL (the server to proxy)."""
    from urllib.parse import urlparse

    parsed = urlparse(redis_url)
    if parsed.hostname not in (LOOPBACK, "localhost"):
        raise ValueError("the fault proxy forwards to loopback servers only")
    return parsed.port or 6379


try:  # a ready-made fixture: `from fault_proxy import fault_proxy` in a test module
    import pytest

    @pytest.fixture
    def fault_proxy(redis_url: str):  # type: ignore[no-untyped-def]
        """A started :class:`FaultProxy` in front of the session's redis-server (seed 11)."""
        with FaultProxy(upstream_port_of(redis_url), seed=11) as proxy:
            yield proxy
except ImportError:  # pragma: no cover - the proxy itself needs no pytest
    pass

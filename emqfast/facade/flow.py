"""``emqfast.Flow``: a graph of jobs across queues, admitted so that no job of it runs
while one of its dependencies is missing.

    flow = emqfast.Flow(conn)
    a = flow.add(grading, {"lesson": 1})
    b = flow.add(grading, {"lesson": 2})
    flow.add(certificates, {"learner": 7}, after=[a, b])
    refs = flow.enqueue()

How it stays safe without one transaction (on a Cluster the queues live in different
slots):

- every job's id is minted by :meth:`Flow.add`, so the graph is fixed before anything is
  sent, and a re-run of :meth:`Flow.enqueue` (after a crash, or twice) admits the very same
  jobs: an id that exists is a no-op, and a waiting job whose links were not all sent gets
  them now;
- a cycle is a :class:`~emqfast.errors.DependencyCycle` and a dependency outside the flow
  that does not exist an :class:`~emqfast.errors.UnknownDependency`, both before any write;
- jobs are admitted in topological order, round by round (each round pipelined): a job is
  written only after all its dependencies are written and linked, and waits as ``waiting_deps`` until they completed. A crash part-way
  leaves a prefix of the graph, each admitted job with all its dependencies, so nothing
  runs early; a crash between a waiting job's write and its links is repaired by the
  Workers (:func:`emqfast.facade.deps.settle_op`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from emqfast.backends.drive import run
from emqfast.core import codec, ids
from emqfast.core.errors import DependencyCycle, InputTypeError, InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Op, Returns, operation
from emqfast.core.validation import check_new_job_id
from emqfast.facade import admission, deps
from emqfast.facade.admission import ADMITTED, Job, Shared
from emqfast.facade.options import Backoff
from emqfast.facade.job import JobRef
from emqfast.server.connection import resolve

__all__ = ["Flow", "FlowJob"]

ADMIT_CHUNK = 500  # jobs of one round written (then linked) per pipeline


@dataclass(frozen=True)
class FlowJob:
    """One job of a :class:`Flow` (what :meth:`Flow.add` returns): its queue and id; pass
    it in ``after=[...]`` of the jobs that depend on it."""

    queue: str
    id: str
    flow_id: int = field(repr=False, compare=False, default=0)


@dataclass
class _Node:
    queue: Any                      # the Queue it was added with (binds its ref)
    keys: QueueKeys
    job: Job
    shared: Shared
    odf: str
    after: List[int]                # indexes of the flow jobs it depends on
    outside: List[deps.Dep]         # dependencies outside the flow


class Flow:
    """A DAG of jobs across queues (see the module docstring). ``conn`` is what
    :class:`emqfast.Queue` takes (a client, URL or None); on a Cluster, one cluster
    client reaches every queue."""

    _resolve = staticmethod(resolve)

    def __init__(self, conn: Any = None):
        self.redis = self._resolve(conn)
        self._nodes: List[_Node] = []
        self._by_id: Dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def _drive(self, op: Op) -> Any:
        return run(self.redis, op)

    def add(self, queue: Any, payload: Any, *, after: Iterable[Any] = (),
            job_id: Optional[str] = None, priority: int = 0, attempts: Optional[int] = None,
            backoff: Optional[Backoff] = None, on_dep_failure: str = "fail",
            timeout_ms: Optional[int] = None) -> FlowJob:
        """Add a job of ``queue`` (an :class:`emqfast.Queue` or ``emqfast.aio.Queue``)
        depending on ``after``: jobs of this flow, or JobRefs / ids / ``(queue, id)``
        pairs of jobs already enqueued. The options are enqueue's (``timeout_ms`` limits
        each run). Nothing is sent until :meth:`enqueue`."""
        if not isinstance(getattr(queue, "keys", None), QueueKeys):
            raise InputTypeError(f"Flow.add takes an emqfast Queue, not {type(queue).__name__}")
        job_id = ids.new_id() if job_id is None else check_new_job_id(job_id)
        if job_id in self._by_id:
            raise InvalidInput(f"job id {job_id} is already in this flow")
        data, enc = codec.encode(payload, queue.max_payload_bytes)
        shared = queue._shared(priority, attempts, backoff, None, None, None, timeout_ms)
        node = _Node(queue, queue.keys, Job(job_id, data, enc), shared,
                     deps.check_on_dep_failure(on_dep_failure), [], [])
        self._link(node, after)
        self._by_id[job_id] = len(self._nodes)
        self._nodes.append(node)
        return FlowJob(queue.keys.name, job_id, id(self))

    def depend(self, job: FlowJob, on: Iterable[Any]) -> None:
        """Make ``job`` (of this flow) depend on ``on`` too (as ``after`` does). This is
        how a graph gains an edge to a job added later, so it may close a cycle:
        :meth:`enqueue` refuses that."""
        self._link(self._nodes[self._index(job)], on)

    def _index(self, job: FlowJob) -> int:
        if not isinstance(job, FlowJob) or job.flow_id != id(self) or job.id not in self._by_id:
            raise InvalidInput(f"{job!r} is not a job of this flow")
        return self._by_id[job.id]

    def _named(self, dep: deps.Dep) -> Optional[int]:
        """The index of the job of this flow that ``(queue, id)`` names, or None."""
        at = self._by_id.get(dep[1])
        return at if at is not None and self._nodes[at].keys.name == dep[0] else None

    def _link(self, node: _Node, after: Iterable[Any]) -> None:
        """Add the edges ``after`` to ``node``: every item checked first, so a refused
        list adds none of them."""
        if isinstance(after, (str, bytes, FlowJob)) or deps.is_pair(after) \
                or not deps.iterable(after):
            raise InputTypeError("after takes a list of jobs")
        inside, outside = list(node.after), list(node.outside)
        own = (node.keys.name, node.job.id)
        for item in after:
            if isinstance(item, FlowJob) and item.flow_id == id(self):
                at: Optional[int] = self._index(item)
                dep = (item.queue, item.id)
            else:  # a pair, id or ref naming a job of this flow is an edge inside it
                dep = deps.one_dep(item, node.keys.name)
                at = self._named(dep)
            if dep == own:
                raise DependencyCycle(f"job {node.job.id} of queue {own[0]!r} cannot depend "
                                      "on itself")
            if at is None:
                outside.append(dep)
            else:
                inside.append(at)
        inside, outside = list(dict.fromkeys(inside)), list(dict.fromkeys(outside))
        if len(inside) + len(outside) > deps.MAX_DEPS:
            raise InvalidInput(f"a job takes at most {deps.MAX_DEPS} dependencies")
        node.after, node.outside = inside, outside

    def levels(self) -> List[List[int]]:
        """The jobs' indexes in admission rounds: a round's jobs depend only on jobs of
        earlier rounds (within a round, in the order added); :class:`DependencyCycle` when
        no such order exists."""
        left = {i: len(n.after) for i, n in enumerate(self._nodes)}
        users: Dict[int, List[int]] = {}
        for i, n in enumerate(self._nodes):
            for j in n.after:
                users.setdefault(j, []).append(i)
        out: List[List[int]] = []
        level = [i for i, count in left.items() if not count]
        while level:
            out.append(level)
            ready = []
            for i in level:
                for j in users.get(i, ()):
                    left[j] -= 1
                    if not left[j]:
                        ready.append(j)
            level = sorted(ready)
        stuck = [i for i, count in left.items() if count]
        if stuck:
            named = ", ".join(self._nodes[i].job.id for i in stuck[:5])
            raise DependencyCycle(f"the flow's dependencies form a cycle through: {named}")
        return out

    def order(self) -> List[int]:
        """The jobs' indexes in admission order (:meth:`levels`, flattened)."""
        return [i for level in self.levels() for i in level]

    @operation
    def enqueue(self) -> Returns[List[JobRef]]:
        """Admit the whole flow (topological order; see the module docstring): round by
        round, each round's writes and links pipelined :data:`ADMIT_CHUNK` jobs at a time.
        Returns a ref per job in the order they were added; safe to call again."""
        levels = self.levels()  # a cycle: refused before anything is sent
        outside = [d for n in self._nodes for d in n.outside]
        if outside:
            yield from deps.check_exist(sorted(set(outside)))
        refs: Dict[int, JobRef] = {}
        for level in levels:
            for at in range(0, len(level), ADMIT_CHUNK):
                chunk = level[at:at + ADMIT_CHUNK]
                refs.update(zip(chunk, (yield from self._admit(chunk))))
        for i, ref in refs.items():
            bind = getattr(self._nodes[i].queue, "_bind", None)
            if callable(bind):  # ref.wait() works on a flow's refs too
                bind(ref)
        return [refs[i] for i in range(len(self._nodes))]

    def _admit(self, chunk: List[int]) -> Returns[List[JobRef]]:
        """Admit jobs of one round: plain enqueues for those without dependencies, the
        rest as waiting (:func:`emqfast.facade.deps.admit_many_op`)."""
        nodes = self._nodes
        plain = [i for i in chunk if not nodes[i].after and not nodes[i].outside]
        waits = [i for i in chunk if nodes[i].after or nodes[i].outside]
        got: Dict[int, JobRef] = {}
        if plain:
            replies = yield Batch([admission.enqueue_call(nodes[i].keys, nodes[i].job,
                                                          nodes[i].shared) for i in plain])
            deps.raise_any(replies)
            got.update((i, JobRef(nodes[i].job.id, ADMITTED.get(int(r), "duplicate")))
                       for i, r in zip(plain, replies))
        if waits:
            items = [deps.Admit(nodes[i].keys, nodes[i].job, nodes[i].shared,
                                [(nodes[j].keys.name, nodes[j].job.id) for j in nodes[i].after]
                                + nodes[i].outside, nodes[i].odf) for i in waits]
            got.update(zip(waits, (yield from deps.admit_many_op(items))))
        return [got[i] for i in chunk]

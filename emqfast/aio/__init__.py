"""emqfast over asyncio: the same scripts, keys and logic as the sync facade.

    import emqfast.aio as emq

    async def main():
        q = emq.Queue("mail", emq.connect())
        await q.enqueue({"to": "ada@example.com"})

        async def send(job):
            await mailer.send(job.payload)

        await emq.Worker(q, send, concurrency=50).run()

Every method of :class:`Queue`, ``Queue.schedules`` and :class:`Leaderboard`
is the sync one (an :mod:`emqfast.core.ops` generator) run by an asyncio driver,
so it returns a coroutine.
"""
from emqfast.aio.connection import connect
from emqfast.aio.flow import Flow
from emqfast.aio.queue import Leaderboard, PartitionedQueue, Queue, promote_many
from emqfast.aio.job_wait import wait_all
from emqfast.aio.worker import Worker

__all__ = ["Flow", "Leaderboard", "PartitionedQueue", "Queue", "Worker", "connect",
           "promote_many", "wait_all"]

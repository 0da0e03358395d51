"""Is the server allowed to evict emqfast's keys?

A Redis whose ``maxmemory-policy`` evicts (``allkeys-lru``, ``volatile-ttl``...) may drop
any job hash, pending set or lease under memory pressure: jobs would vanish without an
error. Workers refuse such a server unless told otherwise (``allow_eviction=True``);
:func:`check` says why. Only ``noeviction`` keeps every key (a full server then refuses
writes with OOM, which emqfast reports as :class:`~emqfast.errors.ServerFull` and
Workers wait out).

The policy is read from ``INFO memory`` (``maxmemory_policy``), which managed services and
the least-privilege ACL user allow (``CONFIG`` is often denied or renamed); ``CONFIG GET
maxmemory-policy`` only where INFO does not say (a server that omits the field).
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

SAFE_POLICIES = ("noeviction",)


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _worst(policies: Any) -> Optional[str]:
    """Of several nodes' policies (a cluster client's per-node replies), an evicting one."""
    known = [p for p in policies if p is not None]
    unsafe = [p for p in known if p not in SAFE_POLICIES]
    worst: Optional[str] = (unsafe or known or [None])[0]
    return worst


def _from_config(reply: Any) -> Optional[str]:
    if isinstance(reply, dict):
        for key, value in reply.items():
            if isinstance(value, dict):  # per node
                return _worst(_from_config(v) for v in reply.values())
            if _text(key) == "maxmemory-policy":
                return _text(value)
    return None


def _from_info(reply: Any) -> Optional[str]:
    if isinstance(reply, dict):
        if "maxmemory_policy" in reply:
            return _text(reply["maxmemory_policy"])
        return _worst(_from_info(v) for v in reply.values() if isinstance(v, dict))
    return None


def verdict(policy: Optional[str]) -> Optional[str]:
    """The warning for a policy (None when it keeps every key, or is unknown)."""
    if policy is None or policy in SAFE_POLICIES:
        return None
    return (f"redis maxmemory-policy is {policy!r}: under memory pressure the server may "
            "evict job hashes, queues and leases, and jobs would vanish. Use "
            "maxmemory-policy noeviction for emqfast's server (or accept the risk: "
            "Worker(..., allow_eviction=True), `emqfast worker --allow-eviction`)")


def read_policy(client: Any) -> Optional[str]:
    """The server's ``maxmemory-policy`` (INFO memory, else CONFIG GET), None if unreadable."""
    try:
        policy = _from_info(client.info("memory"))
        if policy is not None:
            return policy
    except Exception:  # noqa: BLE001 - INFO denied: CONFIG may still say it
        pass
    try:
        return _from_config(client.config_get("maxmemory-policy"))
    except Exception:  # noqa: BLE001 - not readable at all: nothing to say
        return None


def check(client: Any) -> Optional[str]:
    """A warning when ``client``'s server may evict emqfast's keys, else None (a sync
    ``redis.Redis`` or cluster client)."""
    return verdict(read_policy(client))


async def read_policy_async(client: Any) -> Optional[str]:
    """:func:`read_policy` over a ``redis.asyncio`` client."""
    try:
        policy = _from_info(await _awaited(client.info("memory")))
        if policy is not None:
            return policy
    except Exception:  # noqa: BLE001 - see read_policy
        pass
    try:
        return _from_config(await _awaited(client.config_get("maxmemory-policy")))
    except Exception:  # noqa: BLE001
        return None


async def check_async(client: Any) -> Optional[str]:
    """:func:`check` over a ``redis.asyncio`` client."""
    return verdict(await read_policy_async(client))


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value

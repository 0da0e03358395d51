"""A real 3-master Redis Cluster on loopback, for the cluster tests.

``start_cluster()`` starts ``redis-server --cluster-enabled yes`` on free ports,
joins them with ``redis-cli --cluster create`` and waits (with a deadline) until
every node reports ``cluster_state:ok``. No fakes: it is the real thing, torn
down by :meth:`Cluster.stop`.

``start_cluster(3, replicas=1, node_timeout_ms=1500)`` adds one replica per master
(``Cluster.replica_ports``; ``Cluster.ports`` stays the masters) and waits until each
replica's link to its master is up. :meth:`Cluster.kill` SIGKILLs a node and
:meth:`Cluster.wait_promoted` waits for its replica to take over (failover tests).
"""
from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List

import redis

from waiting import wait_until

def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _cluster_port(taken: List[int]) -> int:
    """A free port whose cluster-bus twin (port + 10000) is free too (so port <= 55535)."""
    while True:
        port = random.randint(20000, 45000)
        if port not in taken and port + 10000 not in taken and \
                _bindable(port) and _bindable(port + 10000):
            return port


@dataclass
class Cluster:
    """A running cluster: its nodes' ports, processes and scratch directory."""

    ports: List[int]
    procs: List[subprocess.Popen]
    workdir: str
    _slot_owner: Dict[int, int] = field(default_factory=dict)
    replica_ports: List[int] = field(default_factory=list)
    proc_of: Dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The URL :func:`emqfast.connect` takes for this cluster."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def owner_port(self, slot: int) -> int:
        """Port of the master serving ``slot`` (from ``CLUSTER SLOTS`` at start-up)."""
        for (lo, hi), port in self._ranges():
            if lo <= slot <= hi:
                return port
        raise KeyError(slot)

    def _ranges(self):
        with redis.Redis(port=self.ports[0]) as c:
            for lo, hi, master, *_ in c.execute_command("CLUSTER SLOTS"):
                yield (int(lo), int(hi)), int(master[1])

    def replica_of(self, master_port: int) -> int:
        """Port of the replica of the master on ``master_port`` (from its INFO)."""
        with redis.Redis(port=master_port, socket_timeout=2) as c:
            info = c.info("replication")
        for key, value in info.items():
            if key.startswith("slave") and isinstance(value, dict):
                return int(value["port"])
        raise LookupError(f"master {master_port} has no replica")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (no final flush, no goodbye to the cluster)."""
        proc = self.proc_of[port]
        proc.kill()
        proc.wait(10)

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start the (killed) node on ``port`` again with its own nodes.conf: it rejoins
        the cluster, as a replica of whoever took its slots over; waits for its link."""
        old = self.proc_of[port]
        self.proc_of[port] = subprocess.Popen(old.args, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL)
        self.procs.append(self.proc_of[port])

        def linked() -> bool:
            try:
                info = _role(port)
            except redis.RedisError:
                return False
            return info.get("role") == "slave" and info.get("master_link_status") == "up"
        wait_until(linked, timeout, f"node {port} to rejoin as a replica", interval=0.05)

    def wait_promoted(self, replica_port: int, timeout: float = 30.0) -> None:
        """Wait until the node on ``replica_port`` is a master serving slots and every
        live node agrees the cluster is ok."""
        def promoted() -> bool:
            try:
                with redis.Redis(port=replica_port, socket_timeout=2) as c:
                    if c.info("replication").get("role") != "master":
                        return False
            except redis.RedisError:
                return False
            return all(_node_ok(p) for p in self.live_ports())
        wait_until(promoted, timeout, f"replica {replica_port} to take over", interval=0.05)

    def refresh_roles(self) -> None:
        """Re-read who is master and who replica (after a failover): ``ports`` := the live
        masters, ``replica_ports`` := the live replicas."""
        live = self.live_ports()
        roles = {p: _role(p).get("role") for p in live}
        self.ports[:] = [p for p in live if roles[p] == "master"]
        self.replica_ports[:] = [p for p in live if roles[p] == "slave"]

    def live_ports(self) -> List[int]:
        """Ports of the nodes whose process still runs."""
        return [p for p, proc in self.proc_of.items() if proc.poll() is None]

    def stop(self) -> None:
        """Terminate every node and delete the scratch directory."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _node_ok(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=2) as c:
            info = c.execute_command("CLUSTER INFO")
            if isinstance(info, bytes):
                info = info.decode()
            text = info if isinstance(info, str) else str(info)
            return "cluster_state:ok" in text or (isinstance(info, dict)
                                                  and info.get("cluster_state") == "ok")
    except redis.RedisError:
        return False


def _pingable(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=1) as c:
            return bool(c.ping())
    except redis.RedisError:
        return False


def start_cluster(masters: int = 3, extra_args: Iterable[str] = (),
                  timeout: float = 30.0, replicas: int = 0,
                  node_timeout_ms: int = 5000) -> Cluster:
    """Start and join ``masters`` cluster nodes (each with ``replicas`` replicas); raise
    if the cluster is not ok in time. ``Cluster.ports`` are the masters."""
    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if exe is None or cli is None:
        raise RuntimeError("redis-server / redis-cli not on PATH: run `make test`")
    workdir = tempfile.mkdtemp(prefix="emq-test-cluster-")
    ports: List[int] = []
    for _ in range(masters * (1 + replicas)):
        ports.append(_cluster_port(ports))
    procs: List[subprocess.Popen] = []
    cluster = Cluster(ports, procs, workdir)
    try:
        for port in ports:
            node_dir = Path(workdir) / str(port)
            node_dir.mkdir()
            procs.append(subprocess.Popen(
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", str(node_dir / "nodes.conf"),
                 "--cluster-node-timeout", str(node_timeout_ms), "--save", "",
                 "--appendonly", "no",
                 "--dir", str(node_dir), *extra_args],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports:
            wait_until(lambda: _pingable(port), timeout, f"cluster node {port} to start",
                       interval=0.05)
        subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                        "--cluster-replicas", str(replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=timeout)
        cluster.proc_of.update(zip(ports, procs))
        for port in ports:
            wait_until(lambda: _node_ok(port), timeout, f"cluster_state:ok on {port}",
                       interval=0.05)
        if replicas:
            _split_roles(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _role(port: int) -> dict:
    with redis.Redis(port=port, socket_timeout=2) as c:
        return c.info("replication")


def _split_roles(cluster: Cluster, timeout: float) -> None:
    """``cluster.ports`` := the masters, ``replica_ports`` := the replicas (redis-cli
    chose who is which); wait until every replica's link to its master is up."""
    def roles_settled() -> bool:
        try:
            infos = {p: _role(p) for p in cluster.ports + cluster.replica_ports}
        except redis.RedisError:
            return False
        replicas = [p for p, i in infos.items() if i.get("role") == "slave"]
        return bool(replicas) and all(infos[p].get("master_link_status") == "up"
                                      for p in replicas)
    wait_until(roles_settled, timeout, "replicas in sync with their masters", interval=0.05)
    everyone = cluster.ports + cluster.replica_ports
    cluster.ports[:] = [p for p in everyone if _role(p).get("role") == "master"]
    cluster.replica_ports[:] = [p for p in everyone if p not in cluster.ports]


def names_over_masters(cluster: Cluster, per_master: int, prefix: str) -> List[str]:
    """Queue names whose ``{hash tag}`` slots fall ``per_master`` times on every master."""
    from redis.crc import key_slot

    want = {port: per_master for port in cluster.ports}
    ranges = list(cluster._ranges())
    names: List[str] = []
    i = 0
    while any(want.values()):
        name = f"{prefix}-{i}"
        i += 1
        slot = key_slot(f"emq:{{{name}}}:meta".encode())
        port = next(p for (lo, hi), p in ranges if lo <= slot <= hi)
        if want[port]:
            want[port] -= 1
            names.append(name)
    return names


def node_id(port: int) -> str:
    """The cluster node id of the server on ``port``."""
    with redis.Redis(port=port) as c:
        return c.execute_command("CLUSTER MYID").decode()


def migrate_slot(cluster: Cluster, slot: int, dst_port: int, timeout: float = 30.0) -> int:
    """Move ``slot`` with its keys from one master to another (what ``redis-cli
    --cluster reshard`` does): IMPORTING/MIGRATING, MIGRATE the keys, then SETSLOT NODE
    on both. Clients holding the old slot map get MOVED (or ASK mid-move). Returns
    the number of keys moved."""
    src_port = cluster.owner_port(slot)
    src_id, dst_id = node_id(src_port), node_id(dst_port)
    moved = 0
    with redis.Redis(port=src_port) as src, redis.Redis(port=dst_port) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        deadline = time.monotonic() + timeout
        while True:
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
            if not keys:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"slot {slot} did not drain in time")
            src.execute_command("MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        for c in (dst, src):
            c.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    for port in cluster.ports:  # the third master learns now rather than by gossip
        if port not in (src_port, dst_port):
            with redis.Redis(port=port) as c:
                c.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    return moved

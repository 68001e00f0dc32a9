"""The health tree of a cluster, as data: cluster -> hosts -> procs -> actors.

States: a proc is ``healthy`` (running), ``failed`` (exited or killed, with its
``cause``) or ``lost`` (its host agent fell silent); a host is ``healthy`` or
``lost``. Memory and CPU come from psutil for procs on the hub's machine.
"""

from __future__ import annotations

import socket
import time

import psutil

from .registry import ActorMeshRecord, HostRecord, ProcMeshRecord, exit_cause


def _usage(pid: int) -> dict:
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return {"rss_bytes": proc.memory_info().rss, "cpu_s": round(sum(proc.cpu_times()[:2]), 3),
                    "uptime_s": round(time.time() - proc.create_time(), 3)}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {}


def tree(name: str, hosts: list[HostRecord], proc_meshes: dict[str, ProcMeshRecord],
         actor_meshes: dict[str, ActorMeshRecord], lost_code: int) -> dict:
    """The health tree; ``lost_code`` is the exit code the hub records for lost procs."""
    local = socket.gethostname()
    actors_on: dict[str, list[dict]] = {}
    for record in actor_meshes.values():
        mesh = proc_meshes.get(record.proc_mesh)
        for i, rank in enumerate(record.proc_ranks):
            if mesh is not None and rank < len(mesh.procs):
                actors_on.setdefault(mesh.procs[rank].proc_id, []).append(
                    {"mesh": record.name, "rank": i, "class": record.class_name})
    host_nodes, counts = [], {"healthy": 0, "failed": 0, "lost": 0}
    for host in hosts:
        procs = []
        for mesh in proc_meshes.values():
            for rank, proc in enumerate(mesh.procs):
                if proc.host_id != host.host_id:
                    continue
                if proc.exit_code is None:
                    state, cause = "healthy", None
                elif proc.exit_code == lost_code:
                    state, cause = "lost", "lost with its host"
                else:
                    state, cause = "failed", exit_cause(proc.exit_code)
                counts[state] += 1
                node = {"proc_id": proc.proc_id, "proc_mesh": mesh.name, "rank": rank, "pid": proc.pid,
                        "state": state, "cause": cause, "actors": actors_on.get(proc.proc_id, [])}
                if state == "healthy" and host.hostname == local:
                    node.update(_usage(proc.pid))
                procs.append(node)
        host_nodes.append({"host_id": host.host_id, "hostname": host.hostname, "pid": host.pid,
                           "state": "lost" if host.lost else "healthy", "procs": procs})
    total = sum(counts.values())
    return {"cluster": name, "state": "healthy" if counts["healthy"] == total else "degraded",
            "summary": f"{counts['healthy']}/{total} procs healthy · {counts['failed']} failed · "
                       f"{counts['lost']} lost", "counts": counts, "hosts": host_nodes}

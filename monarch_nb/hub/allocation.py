"""The hub's side of allocation: getting host agents through the cluster's allocator,
and failing hosts whose allocation ended from outside.

Starting waits for every agent to report, up to the allocator's ``start_timeout_s``
(a Slurm job may wait in the queue); while it waits it asks the allocator once a
second whether the allocation already ended (a job that failed at once), so such a
start fails at once with the allocator's account (job state and reason), not at the
timeout. Once running, the same check finds allocations ended from outside (a
cancelled or timed-out job): their hosts are marked failed with that cause and every
call waiting on their procs fails with ``SupervisionError``. An agent stopped by a
signal says so first (``agent_exiting``), which is faster still.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from .registry import HostRecord

ALLOCATION_POLL_S = 1.0  # how often the allocator is asked whether the allocation ended


class AllocationOps:
    """Mixin of ``Hub``: uses its ``allocator``, ``path``, ``n_hosts``, ``hosts``,
    ``host_order``, ``net``, ``proc_meshes``, ``stop_requested``, ``_all_hosts_ready``,
    ``_save()`` and (from supervision) ``_lose_procs_of()`` and ``_procs_died()``."""

    async def _acquire_hosts(self) -> bool:
        """Start host agents (unless re-adopted) and wait until all have reported.
        Returns False, after saying why on stderr, when they don't within the
        allocator's ``start_timeout_s`` or its allocation ends first."""
        if self.hosts:
            self._all_hosts_ready.set()
            return True
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        try:
            self.host_order = await loop.run_in_executor(None, self.allocator.start, self.net.address, self.n_hosts)
        except Exception as e:  # sbatch refused the job, or the like
            print(f"monarch_nb hub: could not get hosts from the {self.allocator.kind} allocator: {e}",
                  file=sys.stderr)
            return False
        if all(h in self.hosts for h in self.host_order):  # they reported while start() returned
            self._all_hosts_ready.set()
        self._save()  # the allocation (e.g. the job id) is in the state file from now on
        timeout = self.allocator.start_timeout_s
        while not self._all_hosts_ready.is_set():
            try:
                await asyncio.wait_for(self._all_hosts_ready.wait(), ALLOCATION_POLL_S)
                break
            except asyncio.TimeoutError:
                pass
            if self.stop_requested.is_set() or not self.path.is_dir():
                print("monarch_nb hub: stopped (or the cluster directory was removed) while waiting "
                      "for host agents", file=sys.stderr)
                return False
            os.utime(self.path)  # a long queue wait: clients see a starting cluster, not a stale one
            ended = await loop.run_in_executor(None, self.allocator.check)
            waited = time.monotonic() - t0
            if ended or waited > timeout:
                why = await loop.run_in_executor(None, self.allocator.waiting_for)
                missing = [h for h in self.host_order if h not in self.hosts]
                print(f"monarch_nb hub: host agents {', '.join(missing)} did not report within {waited:.0f} s"
                      f"{' (the allocation ended)' if ended else f' (start timeout {timeout:.0f} s)'}"
                      f"{'; ' + why if why else ''}", file=sys.stderr)
                return False
        return True

    async def _watch_allocation(self) -> None:
        """Fail the hosts whose allocation ended while the cluster runs."""
        loop = asyncio.get_running_loop()
        while not self.stop_requested.is_set():
            await asyncio.sleep(ALLOCATION_POLL_S)
            try:
                ended = await loop.run_in_executor(None, self.allocator.check)
            except Exception as e:  # squeue failing for a while: the heartbeats still watch every host
                print(f"monarch_nb hub: could not ask the {self.allocator.kind} allocator about its hosts: {e}",
                      file=sys.stderr)
                continue
            if self.stop_requested.is_set():
                return  # our own shutdown ends the allocation
            for host_id, why in ended.items():
                host = self.hosts.get(host_id)
                if host is None or host.cause == why:
                    continue
                if host.cause:  # failed on its agent's word; now the allocator says why
                    host.cause = why
                    self._save()
                else:
                    await self._host_failed(host, why)

    async def op_agent_exiting(self, header, message):
        """An agent is stopping on a signal that did not come from this hub: fail its
        host (and procs) before replying."""
        host = self.hosts.get(header["host_id"])
        if host is not None and not host.cause and not self.stop_requested.is_set():
            ended = await asyncio.get_running_loop().run_in_executor(None, self.allocator.check)
            await self._host_failed(host, ended.get(host.host_id) or header.get("why", "its host agent is exiting"))
        return {}  # the agent holds its procs' exit reports until this reply

    async def _host_failed(self, host: HostRecord, cause: str) -> None:
        """``host`` is gone for ``cause``: it shows as failed in the health tree, and its
        live procs are failed (calls waiting on them raise ``SupervisionError``)."""
        host.cause = cause
        host.lost = True
        self.net.forget(host.address)  # gone for good: nothing queued for it may hold the hub's exit
        print(f"monarch_nb hub: host {host.host_id} ({host.node or host.hostname}) failed: {cause}", file=sys.stderr)
        await self._procs_died(self._lose_procs_of(host), False,
                               f"was lost with its host {host.node or host.hostname}: {cause}")
        self._save()

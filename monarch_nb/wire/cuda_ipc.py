"""CUDA tensors in messages by CUDA IPC, between processes of one host.

Which path a CUDA tensor in a message takes is the sender's choice, made when the
message is pickled (:func:`by_ipc`), by ``MONARCH_NB_CUDA_IPC`` in the sender:

- unset, or ``auto`` (the default): by CUDA IPC when every receiver of the message is a
  process of this host's network namespace (``wire.shm.is_local`` of each address), else
  staged through host memory (``wire.cuda_tensors``). A message pickled without known
  receivers (``serialize.dumps`` without ``destinations``: a call through the host
  routers, a spawn's arguments) is staged;
- ``1``: always by CUDA IPC (a receiver on another host then fails with
  :class:`CudaIpcUnavailable`);
- ``0``: always staged.

By IPC, a CUDA tensor in a message is not copied to host memory: the message carries a
token, and the sender's :class:`Keeper` keeps the tensor alive for it. The receiver's
unpickler connects to the keeper (a Unix socket of the host; the side channel of
``protocol.cuda_ipc``), gets the IPC handle, copies the tensor into its own allocation on
its own device (``CudaOps.ipc_open``; messages are values) and says so; the keeper then
drops its reference. Who keeps what:

- the keeper holds a reference to the tensor from pickling until its receivers copied
  it (the sender's own variable may be gone long before);
- torch's own IPC reference counting additionally keeps the memory mapped while a
  receiver has it open (a few milliseconds: the receiver closes it right after its
  copy). torch's counting alone would not do: it can't tell a message not yet received
  from one never to be received, and a receiver killed while it has the memory open
  leaves the block in the sender until the sender exits (torch documents this);
- a receiver that dies (or whose connection ends) before it said it copied releases
  its claim, as the kernel closes its socket;
- when the sender knows how many receivers the message has (its destinations), the
  keeper releases the tensor once that many claims ended; a receiver still to claim (an
  actor busy with an earlier call) has ``UNCLAIMED_S`` seconds from the last claim's end;
- a token claimed by no receiver for ``UNCLAIMED_S`` seconds (its message was lost) is
  released; without a known count of receivers, after a claim the keeper waits
  ``LINGER_S`` seconds for more claims before it releases.

A receiver that can't open the handle (no CUDA, another GPU it can't map, a container
without IPC) asks the keeper for the bytes instead and rebuilds the tensor as the staged
path does (``wire.cuda_tensors.place``). A receiver on another host (or another network
namespace) can't reach the keeper at all and raises :class:`CudaIpcUnavailable`; the
default never sends it a token.

Not verified on a GPU yet (every test runs a fake ``CudaOps``).
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import threading
import time
from typing import Any, Collection

from ..protocol import cuda_ipc as channel
from . import cuda, cuda_tensors, shm

ENV = "MONARCH_NB_CUDA_IPC"
AUTO, ALWAYS, NEVER = "auto", "1", "0"  # its values (see mode())
_MODES = (AUTO, ALWAYS, NEVER)
LINGER_S = 1.0
UNCLAIMED_S = 120.0
CLAIM_TIMEOUT_S = 10.0  # a connection of the owner's that sends no claim within this is closed
RECEIVE_TIMEOUT_S = 120.0  # a receiver's wait for each answer of its sender's keeper
_LENGTH = struct.Struct(channel.LENGTH_FORMAT)


class CudaIpcUnavailable(RuntimeError):
    """A CUDA tensor sent by CUDA IPC could not be received (its sender is on another
    host, gone, or released it)."""


def mode() -> str:
    """This process's choice for the CUDA tensors it sends: ``MONARCH_NB_CUDA_IPC``, one
    of ``AUTO`` (unset or empty too), ``ALWAYS`` or ``NEVER`` (see the module docstring).
    Raises ``ValueError`` naming the variable and its values for anything else."""
    value = os.environ.get(ENV) or AUTO
    if value not in _MODES:
        raise ValueError(
            f"{ENV}={value!r} is not one of its values: unset or {AUTO!r} (by CUDA IPC when every "
            f"receiver is a process of this host, else staged through host memory), {ALWAYS!r} "
            f"(always by CUDA IPC: single-host clusters only) or {NEVER!r} (always staged)")
    return value


def by_ipc(destinations: Collection[str] | None) -> bool:
    """Whether the CUDA tensors of a message for ``destinations`` (its receivers'
    addresses, ``tcp://HOST:PORT``; ``None`` when not known) go by CUDA IPC: see
    :func:`mode`. Raises ``ValueError`` for a bad ``MONARCH_NB_CUDA_IPC``."""
    chosen = mode()
    if chosen != AUTO:
        return chosen == ALWAYS
    if not destinations:
        return False
    return all(shm.is_local(address) for address in destinations)


class _Kept:
    __slots__ = ("tensor", "receivers", "since", "open", "done")

    def __init__(self, tensor: Any, receivers: int | None):
        self.tensor = tensor
        self.receivers = receivers  # how many claims to expect; None: not known
        self.since = time.monotonic()  # kept since; then: the last claim's end
        self.open = 0  # claims in progress
        self.done = 0  # claims ended (copied, staged, or the receiver gone)


class Keeper:
    """Keeps CUDA tensors shared by IPC alive until their receivers copied them; serves
    their claims on an abstract Unix socket, one thread per claim. ``linger_s`` and
    ``unclaimed_s``: see the module docstring (seconds)."""

    def __init__(self, linger_s: float = LINGER_S, unclaimed_s: float = UNCLAIMED_S):
        self.linger_s, self.unclaimed_s = linger_s, unclaimed_s
        self.pid = os.getpid()
        self.address = f"\0monarch-nb-cuda-ipc-{self.pid}-{secrets.token_hex(8)}"
        self._kept: dict[bytes, _Kept] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.claims = 0  # claims served since start
        self.staged = 0  # of them, answered with the bytes (the receiver could not open the handle)
        self.refused = 0  # connections of other users, closed unread
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        self._sock.settimeout(0.2)  # how often unclaimed and lingering tensors are released
        threading.Thread(target=self._accept, name="monarch-nb-cuda-ipc", daemon=True).start()

    def keep(self, tensor: Any, receivers: int | None = None) -> bytes:
        """Keep ``tensor`` for its receivers (``receivers`` of them, when known: it is
        released once that many claims ended); returns its token."""
        token = secrets.token_bytes(channel.TOKEN_BYTES)
        with self._lock:
            self._kept[token] = _Kept(tensor, receivers)
        return token

    def kept(self) -> int:
        """How many tensors are kept now."""
        with self._lock:
            return len(self._kept)

    def claims_open(self) -> int:
        """How many claims are in progress now."""
        with self._lock:
            return sum(k.open for k in self._kept.values())

    def close(self) -> None:
        """Stop serving and release every tensor."""
        self._closed = True
        self._sock.close()
        with self._lock:
            self._kept.clear()

    def _release_due(self) -> None:
        now = time.monotonic()
        with self._lock:  # the loops in a method of their own: see monarch_nb.wire.interrupts
            self._drop_due(now)

    def _drop_due(self, now: float) -> None:
        """Release the tensors no claim holds whose time is up. The caller holds the lock."""
        due = [t for t, k in self._kept.items() if not k.open and self._due(k, now)]
        for token in due:
            del self._kept[token]

    def _due(self, kept: _Kept, now: float) -> bool:
        if kept.receivers is not None:  # every receiver copied it, or those still out are late
            return kept.done >= kept.receivers or now - kept.since >= self.unclaimed_s
        return now - kept.since >= (self.linger_s if kept.done else self.unclaimed_s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                self._release_due()
                continue
            except OSError:  # closed
                return
            # Another user's connection is closed here, before it costs a thread: the
            # socket's name is listed in /proc/net/unix, and a claim read on a thread first
            # let anyone hold one thread of this process per silent connection.
            try:
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            except OSError:
                uid = None
            if uid != os.getuid():
                self.refused += 1
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        kept = None
        try:
            conn.settimeout(CLAIM_TIMEOUT_S)  # a claim is sent as the connection opens
            claim = _recv_exact(conn, 1 + channel.TOKEN_BYTES)
            conn.settimeout(None)
            if claim[:1] != channel.CLAIM:
                return
            with self._lock:
                kept = self._kept.get(bytes(claim[1:]))
                if kept is not None:
                    kept.open += 1
            if kept is None:
                conn.sendall(_LENGTH.pack(0))
                return
            try:
                shared = cuda.ops().ipc_share(kept.tensor)
            except (RuntimeError, OSError):  # this tensor can't be shared: the receiver asks for bytes
                shared = None
            handle = pickle.dumps(shared, protocol=5)
            with self._lock:  # counted before the receiver has it (and may ask how many were served)
                self.claims += 1
            conn.sendall(_LENGTH.pack(len(handle)) + handle)
            if conn.recv(1) == channel.STAGE:
                with self._lock:
                    self.staged += 1
                data = _bytes_of(cuda.ops().to_host(kept.tensor, pinned=True))
                conn.sendall(_LENGTH.pack(data.nbytes))
                conn.sendall(data)
                conn.recv(1)  # the receiver closes once it has them
        except OSError:
            pass  # the receiver went away: its claim ends below
        finally:
            conn.close()
            if kept is not None:
                with self._lock:
                    kept.open -= 1
                    kept.done += 1
                    kept.since = time.monotonic()
                    all_claimed = kept.receivers is not None and kept.done >= kept.receivers
                if self.linger_s <= 0 or all_claimed:
                    self._release_due()


def _bytes_of(host: Any) -> memoryview:
    import torch

    return memoryview(host.reshape(-1).view(torch.uint8).numpy())


def _recv_exact(conn: socket.socket, n: int, into: bytearray | None = None) -> bytearray:
    buf = bytearray(n) if into is None else into
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError("the CUDA IPC keeper closed the connection")
        got += k
    return buf


_keeper: Keeper | None = None
_keeper_lock = threading.Lock()


def keeper() -> Keeper:
    """This process's keeper, started at the first tensor sent by IPC."""
    global _keeper
    with _keeper_lock:
        if _keeper is None or _keeper.pid != os.getpid():  # a forked child starts its own
            _keeper = Keeper()
        return _keeper


def reduce(tensor: Any, receivers: int | None = None) -> Any:
    """The pickle reduction of CUDA tensor ``tensor`` by IPC: a token of this process's
    keeper, which keeps it until its receivers (``receivers`` of them, when known) copied
    it."""
    k = keeper()
    token = k.keep(tensor, receivers)
    ops = cuda.ops()
    return rebuild, (k.address, k.pid, token, tensor.dtype, tuple(tensor.shape),
                     tensor.requires_grad, ops.device_index(tensor))


def rebuild(address: str, pid: int, token: bytes, dtype: Any, shape: tuple, requires_grad: bool,
            index: int) -> Any:
    """Inverse of :func:`reduce`, run by the receiver's unpickler. Raises
    :class:`CudaIpcUnavailable` when the sender's keeper can't be reached or released
    the tensor."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(RECEIVE_TIMEOUT_S)
    try:
        try:
            conn.connect(address)
            peer = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError as e:
            raise CudaIpcUnavailable(
                f"a CUDA tensor sent by CUDA IPC could not be received: its sender (pid {pid}) is not "
                f"reachable from here ({e}); it is on another host or in another network namespace, or "
                f"has exited. Set {ENV}={NEVER} in the sender to stage CUDA tensors through host "
                f"memory (unset, it picks CUDA IPC only for receivers of its own host)") from None
        if peer != pid:
            raise CudaIpcUnavailable(f"the CUDA IPC keeper at this address is pid {peer}, not the sender {pid}")
        try:
            return _claim(conn, pid, token, dtype, shape, requires_grad, index)
        except OSError as e:  # ended by the sender, or no answer for RECEIVE_TIMEOUT_S
            raise CudaIpcUnavailable(f"the sender (pid {pid}) of a CUDA tensor sent by CUDA IPC "
                                     f"ended the transfer or stopped answering: {e}") from None
    finally:
        conn.close()


def _claim(conn: socket.socket, pid: int, token: bytes, dtype: Any, shape: tuple, requires_grad: bool,
           index: int) -> Any:
    """The claim of token ``token`` on connected ``conn``: the receiver's own copy.
    Raises ``OSError`` (``ConnectionError``, ``TimeoutError``) when the keeper ends the
    connection or does not answer."""
    conn.sendall(channel.CLAIM + token)
    n = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))[0]
    if n == 0:
        raise CudaIpcUnavailable(
            f"a CUDA tensor sent by CUDA IPC was released by its sender (pid {pid}) before this "
            f"process received it (kept {UNCLAIMED_S:.0f} s unclaimed or after its other receivers' "
            f"copies, {LINGER_S:.0f} s after a copy when the sender did not know its receivers); set "
            f"{ENV}={NEVER} in the sender for messages received late (staged through host memory)")
    handle = pickle.loads(_recv_exact(conn, n))  # from the sender itself (its pid checked)
    ops = cuda.ops()
    try:
        if handle is None:
            raise RuntimeError("the sender could not share it")
        if ops.device_count() == 0:  # no need to try: a CPU-only torch raises AssertionError there
            raise RuntimeError("no CUDA here")
        tensor = ops.ipc_open(handle)
    except (RuntimeError, OSError):
        conn.sendall(channel.STAGE)
        tensor = cuda_tensors.place(_receive_bytes(conn, dtype, shape), index)
    else:
        conn.sendall(channel.COPIED)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _receive_bytes(conn: socket.socket, dtype: Any, shape: tuple) -> Any:
    import torch

    n = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))[0]
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    data = _recv_exact(conn, n)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def _after_fork() -> None:
    global _keeper
    if _keeper is not None:  # the parent's socket and thread are not this process's: a copy of
        _keeper._sock.close()  # the socket left open here would take the parent's claims once it exits
    _keeper = None


os.register_at_fork(after_in_child=_after_fork)

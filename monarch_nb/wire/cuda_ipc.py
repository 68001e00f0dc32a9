"""CUDA tensors in messages by CUDA IPC, between processes of one host (opt-in).

With ``MONARCH_NB_CUDA_IPC=1`` in the sender, a CUDA tensor in a message is not copied
to host memory: the message carries a token, and the sender's :class:`Keeper` keeps the
tensor alive for it. The receiver's unpickler connects to the keeper (a Unix socket of
the host; the side channel of ``protocol.cuda_ipc``), gets the IPC handle, copies the
tensor into its own allocation on its own device (``CudaOps.ipc_open``; messages are
values) and says so; the keeper then drops its reference. Who keeps what:

- the keeper holds a reference to the tensor from pickling until its receivers copied
  it (the sender's own variable may be gone long before);
- torch's own IPC reference counting additionally keeps the memory mapped while a
  receiver has it open (a few milliseconds: the receiver closes it right after its
  copy). torch's counting alone would not do: it can't tell a message not yet received
  from one never to be received, and a receiver killed while it has the memory open
  leaves the block in the sender until the sender exits (torch documents this);
- a receiver that dies (or whose connection ends) before it said it copied releases
  its claim, as the kernel closes its socket;
- a token claimed by no receiver for ``UNCLAIMED_S`` seconds (its message was lost) is
  released; after a claim, the keeper waits ``LINGER_S`` seconds for more claims (the
  same message sent to every actor of a mesh) before it releases.

A receiver that can't open the handle (no CUDA, another GPU it can't map, a container
without IPC) asks the keeper for the bytes instead and rebuilds the tensor as the staged
path does (``wire.cuda_tensors.place``). A receiver on another host (or another network
namespace) can't reach the keeper at all and raises :class:`CudaIpcUnavailable`: the
opt-in is for single-host clusters.

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
from typing import Any

from ..protocol import cuda_ipc as channel
from . import cuda, cuda_tensors

ENV = "MONARCH_NB_CUDA_IPC"
LINGER_S = 1.0
UNCLAIMED_S = 120.0
RECEIVE_TIMEOUT_S = 120.0  # a receiver's wait for each answer of its sender's keeper
_LENGTH = struct.Struct(channel.LENGTH_FORMAT)


class CudaIpcUnavailable(RuntimeError):
    """A CUDA tensor sent by CUDA IPC could not be received (its sender is on another
    host, gone, or released it)."""


def enabled() -> bool:
    """Whether this process sends CUDA tensors by IPC (``MONARCH_NB_CUDA_IPC=1``)."""
    return os.environ.get(ENV) == "1"


class _Kept:
    __slots__ = ("tensor", "since", "open", "done")

    def __init__(self, tensor: Any):
        self.tensor = tensor
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
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(64)
        self._sock.settimeout(0.2)  # how often unclaimed and lingering tensors are released
        threading.Thread(target=self._accept, name="monarch-nb-cuda-ipc", daemon=True).start()

    def keep(self, tensor: Any) -> bytes:
        """Keep ``tensor`` for its receivers; returns its token."""
        token = secrets.token_bytes(channel.TOKEN_BYTES)
        with self._lock:
            self._kept[token] = _Kept(tensor)
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
        due = [t for t, k in self._kept.items() if not k.open and now - k.since >= (
            self.linger_s if k.done else self.unclaimed_s)]
        for token in due:
            del self._kept[token]

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                self._release_due()
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        kept = None
        try:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            claim = _recv_exact(conn, 1 + channel.TOKEN_BYTES)
            if uid != os.getuid() or claim[:1] != channel.CLAIM:
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
            conn.sendall(_LENGTH.pack(len(handle)) + handle)
            with self._lock:
                self.claims += 1
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
                if self.linger_s <= 0:
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


def reduce(tensor: Any) -> Any:
    """The pickle reduction of CUDA tensor ``tensor`` by IPC: a token of this process's
    keeper, which keeps it until its receivers copied it."""
    k = keeper()
    token = k.keep(tensor)
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
                f"a CUDA tensor sent by CUDA IPC ({ENV}=1) could not be received: its sender "
                f"(pid {pid}) is not reachable from here ({e}); it is on another host or in another "
                f"network namespace, or has exited. Leave {ENV} unset for multi-host clusters") from None
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
            f"a CUDA tensor sent by CUDA IPC ({ENV}=1) was released by its sender (pid {pid}) "
            f"before this process received it (kept {UNCLAIMED_S:.0f} s unclaimed, {LINGER_S:.0f} s after "
            f"the last receiver's copy); leave {ENV} unset for messages received late")
    handle = pickle.loads(_recv_exact(conn, n))  # from the sender itself (its pid checked)
    ops = cuda.ops()
    try:
        if handle is None:
            raise RuntimeError("the sender could not share it")
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

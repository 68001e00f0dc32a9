"""The side channel of a CUDA tensor sent by CUDA IPC (``wire.cuda_ipc``).

The message carries the sender keeper's address (a Unix socket of that host) and a
token. The receiver connects and sends ``CLAIM`` + the token; the keeper answers with an
8-byte big-endian length and the pickled IPC handle (length 0: the token is unknown, its
tensor was released). The receiver then sends ``COPIED`` once it holds its own copy, or
``STAGE`` when it can't open the handle, and the keeper answers that with an 8-byte
length and the tensor's bytes. A connection that ends without either (the receiver
died) releases the claim too.
"""

from __future__ import annotations

CLAIM = b"C"  # receiver -> keeper, followed by the TOKEN_BYTES-long token
COPIED = b"D"  # receiver -> keeper: copied into its own allocation; the keeper may release
STAGE = b"S"  # receiver -> keeper: send the bytes instead (u64 length + data)
TOKEN_BYTES = 16
LENGTH_FORMAT = ">Q"  # every length on the channel

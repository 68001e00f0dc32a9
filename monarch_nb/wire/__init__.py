"""The only code that touches raw frames, keys and pickling.

``serialize`` turns objects into a pickle stream plus out-of-band buffers;
``frames`` signs and verifies frame sets; ``sockets`` makes loopback zmq sockets;
``mailbox`` is a process's inbox for replies, with futures' waiting built on it.

May import ``protocol`` (the vocabulary it carries), ``errors`` and ``mesh``; nothing
that runs in one kind of process only (proc, host, hub, client).
"""

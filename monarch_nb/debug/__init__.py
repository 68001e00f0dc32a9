"""Distributed breakpoints: debugpy in every proc, a DAP client of ours, a relay to IDEs.

Proc side: ``arming`` starts debugpy (in process, on a socketpair: no port; once per proc) and
owns ``sys.breakpointhook``; ``session`` is the proc's own DAP client, which turns
debugpy's stops into entries of the hub's debug registry and answers the client's
debug requests (where, locals, eval, step, continue); ``mux`` lets IDE sessions share
that one debugpy connection. Client side: ``relay`` carries an IDE's DAP bytes from a
127.0.0.1 port over the cluster's signed channel. ``dap`` is the DAP framing both use.

debugpy is imported only when a proc is armed, and only by ``pydevd_adapter``; nothing
here imports IPython. This package sits on the proc runtime: it may import ``proc``,
``protocol``, ``wire`` and the leaf modules, never ``host`` or anything higher; ``proc``
never imports it (``session.install`` plugs it into the proc server).
"""

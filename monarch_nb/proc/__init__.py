"""Worker process runtime: actors, their message loops, and the proc's control loop.

May import ``mesh``, ``protocol``, ``wire`` and the leaf modules (``errors``,
``cluster_dir``, ``lifeline``); never ``debug``, ``host`` or anything higher. Layers
above plug in through ``ProcServer``'s op table and hooks; only the entry point
(``__main__``) puts the debugger in.
"""

"""Host agent: one process per host that starts, reaps and reports procs for the hub.

May import ``proc`` (the record format of procs' output), ``protocol``, ``wire`` and the
leaf modules; never ``debug``, the hub or anything higher.
"""

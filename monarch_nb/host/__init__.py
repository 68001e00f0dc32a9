"""Host agent: one process per host that starts, reaps and reports procs for the hub."""

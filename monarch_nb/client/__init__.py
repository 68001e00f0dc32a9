"""The client: the program that holds mesh handles and sends messages (a script, a
notebook kernel, or an actor that spawns meshes of its own).

What is here, by idea: mesh handles (``host_mesh``, ``proc_mesh``, ``actor_mesh``,
``mesh_handle``, ``value_mesh``), endpoint calls and their results (``endpoint``,
``future``, ``progress``), the cluster's controllers (``controller``), clusters (``cluster``, ``discovery``, ``launch``,
``presence``), the control plane a handle talks to (``control``, the interface: the
hub's in ``hub_client``, this process's own for ``this_proc()`` in ``local_proc``),
what the hub tells a client (``events``, ``logs``, ``supervision``, ``health_watch``),
the debugger's client side (``debugger``) and ``torch.distributed`` set-up
(``torch_env``). No import cycles between these modules: a name needed only in an
annotation is not imported from a module that imports this one.

``runtime`` holds this process as a client in one object (mailbox, supervision, event
bus, log lines, progress, connected cluster); everything here reaches the process's
state through :func:`runtime.runtime`, and the notebook registers its display hooks on
it. A script and a notebook run the same code here and differ only in display.

May import: ``mesh``, ``protocol``, ``wire``, ``errors``, ``cluster_dir``,
``allocators`` (to name an allocator for the hub), ``debug`` (the IDE relay) and from
``proc`` only what a client needs (proc identity, the ``Actor`` base, the in-process
``ProcServer`` of ``this_proc()``, call origins). Never the hub (the vocabulary it shares
with the hub is in ``protocol``), never IPython or ipywidgets: display belongs to
``notebook``, which sits above this package. One deliberate exception:
``Cluster._repr_mimebundle_`` imports ``notebook.display`` inside the method, so that
a displayed cluster shows its health tree in any IPython (extension loaded or not);
only IPython calls it, and nothing of the notebook layer loads before it does.
"""

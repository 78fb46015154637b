"""``ddp-autopsy watch`` / ``run``: catch a hang while it happens (docs/watch.md).

``probe`` reads the job (``/proc``, logs, py-spy), ``detector`` decides, ``watcher`` runs the loop
and calls ``collect``, the analyzer and the reports, ``shared`` lets the watchers of several
nodes meet through a shared directory, ``command`` holds the click commands.
"""

"""Replay at scale: where many replays run (``executor`` here, ``ray_executor`` on a Ray
cluster), the work units of a trace set (``set_tasks``) and the server-argument sweep
(``sweep``, ``sweep_grid``)."""

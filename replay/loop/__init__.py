"""The closed loop's parts: what it reads from a trace (``input``, ``clock``) and takes from it step by step (``feed``), the state it
evolves and how one pass moves it (``state``, ``admit``, ``pools``, ``ratio``, ``preemption``,
``tree_order``), that state as a pass record (``records``), and how close the stock arm
comes to the recording (``selfcheck``); ``run`` runs it (``run_closed_loop``)."""

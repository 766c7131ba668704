"""The TUI's view model: pure code, no Textual, no terminal.

Everything the screens show is computed here from a ``TraceReader`` and an
optional replay ``Report``, so it can be tested (and benchmarked) without an
app. Big per-pass data lives in compact ``array``s, never in lists of objects.

One job per module: ``durations`` (time as text), ``rows`` (pass-list rows
and which passes the list shows), ``pass_cache``, ``header`` (the header
bar), ``diff`` (decision fields side by side), ``rids`` (the compact rid
index), ``scan`` (one pass over the whole trace), ``replay_index`` (a report
by pass number), ``marks`` (events for jumps and marks), ``filters``,
``lifecycle`` (one request's life), ``pools`` (the KV pools of a pass, the
hybrid SWA and mamba ones too) and ``series`` (the timeline).
"""

"""The TUI's view model: pure code, no Textual, no terminal.

Everything the screens show is computed here from a ``TraceReader`` and an
optional replay ``Report``, so it can be tested (and benchmarked) without an
app. Big per-pass data lives in compact ``array``s, never in lists of objects.

One job per module: ``durations`` (time as text), ``rows`` (pass-list rows
and which passes the list shows), ``pass_cache``, ``header`` (the header
bar, fitted to one line), ``diff`` (decision fields side by side), ``rids``
(the compact rid index, found by prefix), ``scan`` (one pass over the whole
trace), ``latch`` (since which pass ``batch_is_full`` held), ``why_lines``
(``analysis.why``'s line per pass), ``replay_index`` (a report by pass
number), ``report_match`` (is the report this trace's?), ``marks`` (events
for jumps and marks, stalls per arm), ``filters``, ``lifecycle`` (one
request's life), ``pools`` (the KV pools of a pass, the hybrid SWA and mamba
ones too), ``charts`` (the charts' columns over time), ``rank_set`` (the
run's ranks and how each is opened), ``desync`` (where the ranks disagree)
and ``damage`` (the gaps, and the passes each lost).
"""

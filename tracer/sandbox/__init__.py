"""The CPU sandbox: the real sglang server on tiny models, with stand-ins only for the GPU.

``server`` (``SandboxServer``), ``models`` (the registry), ``standins`` (what
is stood in for, and why), ``load`` (bench_serving), ``ab`` (a live A/B arm),
``process`` (process groups); docs/sandbox.md describes them.
"""

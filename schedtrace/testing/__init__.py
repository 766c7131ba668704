"""Test support for schedtrace and for its users' suites, shipped apart from the product.

As pytest's ``pytester`` is to pytest: nothing in ``schedtrace`` imports this
package, and it may import the product (the sandbox server, the contract).

- ``requests``: prompts of exact length as ``input_ids``, and ``generate`` on a sandbox.
- ``load``: a timed load of shared-prefix families, priorities and client aborts.
- ``matrix``: the policy matrix's server configurations, each recorded under that load.
- ``builders``, ``synthetic``: records and whole traces made without a server.
- ``rig``: the recorder's hooks driven over one real sglang pass.
"""

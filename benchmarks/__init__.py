"""harbor-pg's benchmarks, one entry point: ``python -m benchmarks --help``.

Each module here with a ``main(argv)`` function is a benchmark (modules whose
name starts with ``_`` are the shared harness and the parts of a benchmark).
A benchmark answers one question a user asks; its module-level ``QUESTION``
says which (else the first line of its docstring). ``--record`` writes the
run's figures into that benchmark's table in ``benchmarks/RESULTS.md``.
"""

"""The ``pvm-dist`` command line: train, eval, bench, compare, info, validate, doctor and sweep."""

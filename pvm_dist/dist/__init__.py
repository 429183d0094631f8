"""Distributed sweeps on Ray: sweep files, the worker actor, the driver and its journal."""

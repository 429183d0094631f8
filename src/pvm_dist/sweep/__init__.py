"""Sweeps on Ray: sweep files and their trial plan, the worker actor, the driver, its journal and policies."""

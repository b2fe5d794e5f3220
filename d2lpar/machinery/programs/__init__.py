"""Programs the tooling runs by path in child processes (not imported): see each docstring."""

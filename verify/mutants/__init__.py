"""Planted bugs (mutants) of the course's checks, one file per notebook; run them with `make mutants`."""

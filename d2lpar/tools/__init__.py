"""Maintainer tools, run by path and importing nothing of d2lpar.

lib.py        `make lib`: generate d2lpar/lessons from the notebooks' `#@save` cells
notebooks.py  `make normalize`: notebooks without outputs, with stable cell ids
"""

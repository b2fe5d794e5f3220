"""What the notebooks teach: one module per notebook, generated from its `#@save` cells.

Do not edit these modules: edit the notebook's cell and run `make lib` (d2lpar/tools/lib.py).
"""

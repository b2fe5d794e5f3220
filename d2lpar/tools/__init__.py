"""The course's machinery, which no notebook teaches: generating d2lpar/lessons (lib.py)."""

"""The book's machinery: what the notebooks read besides the library.

Each chapter has a folder here (``book/<chapter>/``) with its lesson tables and glued prose numbers
(``lesson.py``), its exercises and their checks (``exercises.py``) and the figures it draws from committed results.
The library (:mod:`studylog`) never imports this package; this package imports the library. ``pip install -e .``
installs both.
"""

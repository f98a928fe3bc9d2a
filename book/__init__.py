"""The book's machinery: what the notebooks read besides the library.

Each chapter has a folder here (``book/<chapter>/``) with its lesson tables and glued prose numbers
(``lesson.py``), its exercises and their checks (``exercises.py``) and the figures it draws from committed results
(``figures.py``). ``plotting.py`` saves those figures and writes the README's results (``python -m book plot``);
``site.py`` is the Sphinx extension of the site.
The library (:mod:`studylog`) never imports this package; this package imports the library. ``pip install -e .``
installs both.
"""

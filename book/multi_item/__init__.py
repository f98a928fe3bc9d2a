"""Chapter 6, multi-item scoring attention: the figures, the lesson's tables, targets and numbers, the exercises'
checks, and their answers (``solutions``, which the notebook does not import)."""

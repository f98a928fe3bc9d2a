"""Chapter 6, multi-item scoring attention: the figures, the lesson's tables, targets and numbers, and the exercises."""

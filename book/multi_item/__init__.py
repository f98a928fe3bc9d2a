"""Chapter 6, multi-item scoring attention: the lesson's tables, targets and numbers, and the exercises."""

"""Chapter 7 (constrained decoding end to end): the figures, the lesson's tables and glued numbers, and the
exercises."""

"""Chapter 2, the masked LM head: the figures, the lesson's numbers and tables, and its exercises with their checks."""

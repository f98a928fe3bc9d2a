"""Chapter 3, n-gram matching: the figures, the lesson's tables and target verdicts, and its exercises with their
checks."""

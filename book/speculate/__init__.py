"""Chapter 8 (speculation under a grammar): the lesson's tables and numbers, and the exercises."""

"""Chapter 4, CTC loss: the figures, the lesson's tables and numbers, the blog post's question, and the exercises."""

"""Chapter 4, CTC loss: the figures, the lesson's tables and numbers, the blog post's question, step 6's model in
torch ops, and the exercises."""

"""Chapter 5, ternary matmul: the figures, the two lessons' tables and glued numbers, the result tables, and the
exercises."""

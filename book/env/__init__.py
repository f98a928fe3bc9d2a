"""Chapter 0, the GPU's ceilings: the figure of the committed ceilings."""

"""studylog: a GPU-kernel study log you can read, run and import.

Importing the package first selects how kernels run (see :mod:`studylog.runtime`), so that
Triton kernels defined in the chapter modules use the interpreter on a machine without a GPU.
"""

from studylog import runtime  # noqa: I001  (must come first: sets TRITON_INTERPRET)
from studylog.runtime import describe, device, mode

__version__ = "0.1.0"
__all__ = ["runtime", "mode", "device", "describe", "__version__"]

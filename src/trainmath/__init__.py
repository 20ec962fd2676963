"""trainmath: exact arithmetic of LLM training and serving, and a torch.distributed runtime to check it.

The calculator (everything outside ``trainmath.runtime``) is pure Python: importing it never imports torch
or matplotlib, so the CLI starts fast and the numbers can be used anywhere.
"""

__version__ = "0.1.0"

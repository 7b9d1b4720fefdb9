"""Makes ``nvidia.dali`` (the stand-in beside this file) importable where ``nvidia`` is a
regular package of the interpreter's site-packages (the CUDA wheels).

See nvidia/dali/__init__.py."""

import os

try:
    import nvidia

    _here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvidia")
    if _here not in list(nvidia.__path__):
        nvidia.__path__.append(_here)
except ImportError:
    pass

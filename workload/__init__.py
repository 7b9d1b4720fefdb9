"""In-image benchmark program of ``orchestrate``: ``python -m workload``.

Trains or runs inference on a torchvision classification model with synthetic or JPEG
ImageFolder data and prints JSON lines (``meta``, ``iter``, ``summary`` or ``error``) on stdout.
Imports only the standard library, torch and torchvision; ``pynvml``, ``habana_frameworks``
and ``nvidia.dali`` are optional and used only when importable.  It never imports
``orchestrator``: it runs inside an image that has only PyTorch.
"""

from __future__ import annotations

import warnings

__version__ = "0.1.0"

# torchvision 0.29 deprecates torchvision.io image codecs in favour of torchcodec, which the
# NGC images do not ship; the codecs still work, so keep the warning off stderr.
warnings.filterwarnings(
    "ignore", message=".*image decoding and encoding.*", category=DeprecationWarning
)

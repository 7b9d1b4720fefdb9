"""Lets DeepLearningExamples' ConvNets (@ 729963dd) run on today's Python stack, without
touching its code:

* makes ``nvidia.dali`` (the stand-in beside this file) importable where ``nvidia`` is a regular
  package of the interpreter's site-packages (the CUDA wheels): see nvidia/dali/__init__.py;
* NumPy 2 removed ``np.quantile(..., interpolation=)`` (renamed ``method=`` in 1.22), which DLE's
  logger calls in every ``--evaluate`` run (``TypeError: quantile() got an unexpected keyword
  argument 'interpolation'``, seen on an H100, 2026-11-25; DLE pins numpy < 2): the old keyword
  is passed on as ``method``.
"""

import os
from typing import Any

try:
    import nvidia

    _here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvidia")
    if _here not in list(nvidia.__path__):
        nvidia.__path__.append(_here)
except ImportError:
    pass

try:
    import functools

    import numpy

    if numpy.lib.NumpyVersion(numpy.__version__) >= "2.0.0":
        _quantile = numpy.quantile

        @functools.wraps(_quantile)
        def _quantile_with_interpolation(*args: Any, interpolation: Any = None,
                                         **kwargs: Any) -> Any:
            if interpolation is not None:
                kwargs.setdefault("method", interpolation)
            return _quantile(*args, **kwargs)

        numpy.quantile = _quantile_with_interpolation
except ImportError:
    pass

"""An empty stand-in for NVIDIA DALI, only so DeepLearningExamples' ConvNets can be imported.

DLE @ 729963dd (../shared/peers/dle-convnets) defines its DALI pipeline classes at import time
(``class HybridTrainPipe(Pipeline)``) and fails with ``NameError: name 'Pipeline' is not
defined`` where DALI is not installed, even with ``--data-backend synthetic``. The benchmarks
put this folder on DLE's ``PYTHONPATH`` so those classes can be defined; nothing here runs
with synthetic data, and choosing a DALI backend with it fails. Seen on an H100 on 2026-11-25.
"""

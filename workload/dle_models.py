"""The ConvNets of NVIDIA DeepLearningExamples that torchvision lacks, from torchvision's blocks.

NVIDIA's seeds ran three models of DeepLearningExamples' PyTorch ConvNets
(``PyTorch/Classification/ConvNets``); the workload names them as torchvision would:

=========================  ============================  =========================================
DeepLearningExamples       ``--arch`` here               built as
=========================  ============================  =========================================
``resnet50`` (v1.5)        ``resnet50``                  torchvision's own ``resnet50`` (the
                                                         same network: stride 2 in the 3x3 conv)
``resnext101-32x4d``       ``resnext101_32x4d``          torchvision ``ResNet(Bottleneck,
                                                         [3, 4, 23, 3], groups=32,
                                                         width_per_group=4)``
``se-resnext101-32x4d``    ``se_resnext101_32x4d``       the same with a squeeze-and-excitation
                                                         unit in every bottleneck
=========================  ============================  =========================================

DeepLearningExamples' squeeze-and-excitation unit (unlike torchvision's ``SqueezeExcitation``)
uses two *linear* layers with a fixed 16-unit bottleneck: global average pool -> Linear(C, 16)
-> ReLU -> Linear(16, C) -> sigmoid, and scales the block's output before the residual add.
``tests/test_dle_models.py`` checks that every model here has the same ordered parameter shapes
and parameter count as NVIDIA's code (golden data made from it by
``tests/tools/dle_model_shapes.py``).  Weight initialisation follows torchvision (it does not
change the shapes or the speed).  No pretrained weights exist in torchvision for these names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

#: DeepLearningExamples' name of each model built here.
DLE_NAMES: dict[str, str] = {
    "resnext101_32x4d": "resnext101-32x4d",
    "se_resnext101_32x4d": "se-resnext101-32x4d",
}

#: The fixed width of DeepLearningExamples' squeeze-and-excitation bottleneck.
SE_SQUEEZE = 16


class LinearSqueezeExcitation(nn.Module):
    """Channel attention as DeepLearningExamples defines it (linear layers, 16 hidden units)."""

    def __init__(self, channels: int, squeeze: int = SE_SQUEEZE) -> None:
        super().__init__()
        self.squeeze = nn.Linear(channels, squeeze)
        self.expand = nn.Linear(squeeze, channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-channel weights in (0, 1), shaped (N, C, 1, 1)."""
        w = self.expand(self.relu(self.squeeze(torch.mean(x, (2, 3)))))
        return torch.sigmoid(w)[:, :, None, None]


class SEBottleneck(Bottleneck):
    """torchvision's ResNet bottleneck with the SE unit scaling the output before the add."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.se = LinearSqueezeExcitation(self.conv3.out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out = torch.addcmul(identity, out, self.se(out))  # identity + out * se(out)
        return self.relu(out)


def resnext101_32x4d(num_classes: int = 1000) -> ResNet:
    """ResNeXt-101 32x4d as DeepLearningExamples defines it (44.2 M parameters)."""
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes=num_classes, groups=32, width_per_group=4)


def se_resnext101_32x4d(num_classes: int = 1000) -> ResNet:
    """SE-ResNeXt-101 32x4d as DeepLearningExamples defines it (45.3 M parameters)."""
    return ResNet(
        SEBottleneck,
        [3, 4, 23, 3],
        num_classes=num_classes,
        groups=32,
        width_per_group=4,
    )


#: ``--arch`` name -> constructor taking ``num_classes``.
BUILDERS: dict[str, Callable[[int], nn.Module]] = {
    "resnext101_32x4d": resnext101_32x4d,
    "se_resnext101_32x4d": se_resnext101_32x4d,
}

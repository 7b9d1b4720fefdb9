"""The seeds' models have NVIDIA DeepLearningExamples' layer shapes and parameter counts.

Golden data: ``tests/data/dle_models.json``, written once from NVIDIA's own model code by
``tests/tools/dle_model_shapes.py`` (its docstring has the command).  The parameter names differ
between the two code bases (``layers.0.0`` vs ``layer1.0``), so the ordered shapes and the
counts are compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from workload_support import workload_module

from workload.errors import WeightsError

GOLDEN = json.loads((Path(__file__).parent / "data" / "dle_models.json").read_text())["models"]
#: DeepLearningExamples' models built here (workload.dle_models.BUILDERS: the golden file
#: has them and resnet50, test_golden_covers_every_model_built_here_and_resnet50 checks it).
DLE_ARCHS = sorted(a for a in GOLDEN if a != "resnet50")


models = workload_module("models")
dle_models = workload_module("dle_models")


def _shapes(model: Any) -> list[list[int]]:
    return [list(p.shape) for p in model.parameters()]


@pytest.mark.parametrize("arch", sorted(GOLDEN))
def test_same_ordered_shapes_and_count_as_nvidia(models: Any, arch: str) -> None:
    golden = GOLDEN[arch]
    model = models.build_model(arch, num_classes=1000, pretrained=False, checkpoint_dir=None)
    assert sum(p.numel() for p in model.parameters()) == golden["parameters"]
    assert _shapes(model) == [shape for _, shape in golden["tensors"]]


def test_golden_covers_every_model_built_here_and_resnet50(dle_models: Any) -> None:
    # resnet50 is torchvision's own: DLE's resnet50 (v1.5) must be the same network
    assert set(GOLDEN) == {*dle_models.BUILDERS, "resnet50"}
    assert {GOLDEN[a]["dle_name"] for a in dle_models.BUILDERS} == set(
        dle_models.DLE_NAMES.values())
    assert GOLDEN["resnet50"]["parameters"] == 25_557_032  # ResNet-50's well-known size


def test_golden_models_really_differ(models: Any) -> None:
    """The comparison can fail: the three golden networks are not the same shapes."""
    shapes = {a: [s for _, s in g["tensors"]] for a, g in GOLDEN.items()}
    assert len({json.dumps(s) for s in shapes.values()}) == 3
    resnext = models.build_model("resnext101_32x4d", 1000, False, None)
    assert _shapes(resnext) != shapes["se_resnext101_32x4d"]


@pytest.mark.parametrize("arch", DLE_ARCHS)
def test_forward_backward_and_num_classes(torch: Any, models: Any, arch: str) -> None:
    model = models.build_model(arch, num_classes=10, pretrained=False, checkpoint_dir=None)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_se_unit_scales_before_the_residual_add(torch: Any, dle_models: Any) -> None:
    """With the SE weights forced to 0 (sigmoid 0.5) a block's output is relu(x + out/2)."""
    torch.manual_seed(0)
    block = dle_models.SEBottleneck(256, 64, groups=32, base_width=4).eval()
    for lin in (block.se.squeeze, block.se.expand):
        torch.nn.init.zeros_(lin.weight)
        torch.nn.init.zeros_(lin.bias)
    x = torch.randn(1, 256, 8, 8)
    with torch.no_grad():
        out = block.bn3(block.conv3(block.relu(block.bn2(block.conv2(
            block.relu(block.bn1(block.conv1(x))))))))  # fmt: skip
        assert torch.allclose(block(x), torch.relu(x + 0.5 * out), atol=1e-6)


def test_names_are_known_archs_and_pretrained_is_refused(models: Any, dle_models: Any,
                                                         tmp_path: Path) -> None:
    for arch in dle_models.BUILDERS:
        models.check_arch(arch)
        assert arch in models.classification_archs()
        with pytest.raises(WeightsError, match="no weights for DeepLearningExamples"):
            models.build_model(arch, 1000, pretrained=True, checkpoint_dir=str(tmp_path))

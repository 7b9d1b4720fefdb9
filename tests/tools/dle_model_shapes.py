"""Write ``tests/data/dle_models.json`` from NVIDIA DeepLearningExamples' own model code.

Run once, by hand, where a checkout of DeepLearningExamples' ``PyTorch/Classification/ConvNets``
is on disk (here: ``/work/shared/peers/dle-convnets``; BSD-3 licensed, never copied into this
project), on the CPU::

    cd REPO && /work/main/.venv/bin/python tests/tools/dle_model_shapes.py \\
        --dle /work/shared/peers/dle-convnets --out tests/data/dle_models.json

For each model it records the parameter count and the ordered list of (parameter name, shape)
of the network NVIDIA's code builds (1000 classes, no pretrained weights).
``tests/test_dle_models.py`` compares the workload's models with it (ordered shapes and counts;
the names differ between the two code bases).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

#: DeepLearningExamples' entry point names (``image_classification.models``) -> ours.
MODELS = {
    "resnet50": "resnet50",
    "resnext101_32x4d": "resnext101_32x4d",
    "se_resnext101_32x4d": "se_resnext101_32x4d",
}


def shapes(dle_root: Path) -> dict[str, Any]:
    """Build each model with NVIDIA's code and describe its parameters."""
    sys.path.insert(0, str(dle_root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pytorch_quantization module not found"
        import image_classification.models as dle

    out: dict[str, Any] = {}
    for entry, ours in MODELS.items():
        factory = getattr(dle, entry)
        model = factory(pretrained=False)
        params = list(model.named_parameters())
        out[ours] = {
            "dle_name": factory.name,
            "parameters": sum(p.numel() for _, p in params),
            "tensors": [[name, list(p.shape)] for name, p in params],
        }
    return out


def main() -> int:
    """Command line: --dle DIR --out FILE."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dle", type=Path, required=True, help="ConvNets checkout")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = {
        "generated_by": "tests/tools/dle_model_shapes.py",
        "source": "NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets "
        "image_classification/models (BSD-3-Clause)",
        "models": shapes(args.dle),
    }
    args.out.write_text(render(data), encoding="utf-8")
    return 0


def render(data: dict[str, Any]) -> str:
    """JSON with one tensor per line (reviewable diffs, a tenth of the indented size)."""
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in data.items() if k != "models"]
    lines.append(' "models": {')
    models = list(data["models"].items())
    for i, (name, model) in enumerate(models):
        lines.append(f"  {json.dumps(name)}: {{")
        fields = {k: v for k, v in model.items() if k != "tensors"}
        lines += [f"   {json.dumps(k)}: {json.dumps(v)}," for k, v in fields.items()]
        lines.append('   "tensors": [')
        rows = [f"    {json.dumps(t)}" for t in model["tensors"]]
        lines.append(",\n".join(rows))
        lines.append("   ]")
        lines.append("  }" + ("," if i < len(models) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

"""Write a small, real JPEG dataset in ImageFolder layout (no downloads).

``python -m workload.make_dataset OUT_DIR --classes 4 --per-class 16 --size 96``

Images are smooth random patterns (upsampled low-resolution noise plus a per-class colour
tint), encoded with ``torchvision.io.encode_jpeg``; sizes vary a little around ``--size`` so
the resize path of the loaders is exercised.  Layout: ``OUT_DIR/class_000/img_0000.jpg``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F


def make_image(
    gen: torch.Generator, label: int, classes: int, height: int, width: int
) -> torch.Tensor:
    """One uint8 CHW RGB image with smooth structure and a class-dependent tint."""
    coarse = torch.rand(1, 3, 6, 6, generator=gen)
    image = F.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=False)[0]
    hue = torch.tensor([label / max(classes, 1), 1 - label / max(classes, 1), 0.5]).view(3, 1, 1)
    noise = torch.rand(3, height, width, generator=gen) * 0.1
    image = 0.6 * image + 0.3 * hue + noise
    return (image.clamp(0, 1) * 255).to(torch.uint8)


def make_dataset(
    out_dir: str | Path,
    classes: int = 4,
    per_class: int = 16,
    size: int = 96,
    seed: int = 0,
    quality: int = 90,
) -> list[Path]:
    """Write the dataset; returns the image paths."""
    from torchvision.io import encode_jpeg, write_file

    root = Path(out_dir)
    gen = torch.Generator().manual_seed(seed)
    paths = []
    for label in range(classes):
        folder = root / f"class_{label:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            jitter = torch.randint(-size // 8, size // 8 + 1, (2,), generator=gen).tolist()
            h, w = max(8, size + jitter[0]), max(8, size + jitter[1])
            path = folder / f"img_{i:04d}.jpg"
            write_file(
                str(path), encode_jpeg(make_image(gen, label, classes, h, w), quality=quality)
            )
            paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(
        prog="python -m workload.make_dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out_dir")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--per-class", type=int, default=16)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    paths = make_dataset(args.out_dir, args.classes, args.per_class, args.size, args.seed)
    print(
        f"wrote {len(paths)} JPEGs in {args.classes} classes under {args.out_dir}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

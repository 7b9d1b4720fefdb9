"""Input pipelines: synthetic batches and ImageFolder directories of JPEGs.

* ``synthetic``: one batch generated on the device once and reused every step, so no
  per-step host work (the same choice as DeepLearningExamples' synthetic loader).
* ImageFolder (``DIR/<class>/<image>.jpg``), decoded by the first that works of:
  - DALI (``nvidia.dali``, optional extra, CUDA only): mixed-device nvJPEG decode;
  - torchvision nvJPEG on CUDA: DataLoader workers read the file bytes, the batch is decoded
    with ``torchvision.io.decode_jpeg(..., device="cuda")`` (one call per batch where
    torchvision takes a list, else one per image: :func:`workload.compat.jpeg_decode`) and
    resized on the GPU;
  - CPU: DataLoader workers decode and resize, the uint8 batch is pinned and copied with
    ``non_blocking=True``.
  On CUDA a background thread prepares the next batches on a side stream (prefetch depth 2)
  so data time overlaps compute.  ``WORKLOAD_DECODER=cpu|nvjpeg|dali`` forces a decoder.
Train mode uses RandomResizedCrop + horizontal flip, infer mode resize (size/0.875) +
center crop; normalisation (ImageNet mean/std) and the memory format are applied on the
device.  Batches are drawn forever (random with replacement in train mode, cycling in order in
infer mode), so ``--iterations`` may exceed the dataset size; under DDP each rank draws from
its own disjoint shard of the files (see :class:`ForeverSampler`).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workload import compat
from workload.errors import DataError

log = logging.getLogger(__name__)

JPEG_SUFFIXES = (".jpg", ".jpeg", ".JPG", ".JPEG")
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)

Batch = tuple[torch.Tensor, torch.Tensor]


def find_images(root: str | Path) -> tuple[list[str], list[int], list[str]]:
    """List an ImageFolder tree: (files, labels, class names), classes sorted by name.

    Raises DataError with what was found when the path is not a usable tree of JPEGs.
    """
    path = Path(root)
    if not path.exists():
        raise DataError(
            f"--data {root}: no such directory; pass an ImageFolder directory "
            "(DIR/<class>/<image>.jpg) or --data synthetic"
        )
    if not path.is_dir():
        raise DataError(f"--data {root} is a file, expected an ImageFolder directory")
    classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(
            f"--data {root} has no class subdirectories; expected DIR/<class>/<image>.jpg "
            "(a validation set may need its class folders; see python -m workload.make_dataset)"
        )
    files: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for f in sorted((path / name).rglob("*")):
            if f.suffix in JPEG_SUFFIXES and f.is_file():
                files.append(str(f))
                labels.append(label)
    if not files:
        raise DataError(
            f"--data {root}: {len(classes)} class folders but no .jpg/.jpeg files in them"
        )
    return files, labels, classes


class ForeverSampler(Sampler[int]):
    """Endless indices of this rank's shard: random with replacement (train) or cycling in
    order (infer).

    Under DDP each rank draws from its own disjoint shard (every ``shards``-th file starting
    at ``shard``, as ``DistributedSampler`` splits), so ranks never decode the same files in
    a step and the global batch covers ``shards`` times as many distinct images.  A dataset
    with fewer files than ranks is not sharded (every rank draws from all of it).
    """

    def __init__(
        self, size: int, shuffle: bool, seed: int, shard: int = 0, shards: int = 1
    ) -> None:
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} is not in 0..{shards - 1}")
        self.indices = range(shard, size, shards) if size >= shards else range(size)
        self.shuffle = shuffle
        self.seed = seed

    def __len__(self) -> int:
        """The shard's size (one pass; the iterator itself never ends)."""
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            yield from itertools.cycle(self.indices)
            return
        gen = torch.Generator().manual_seed(self.seed)
        start, step, n = self.indices.start, self.indices.step, len(self.indices)
        while True:
            draws = torch.randint(n, (4096,), generator=gen)
            yield from (draws * step + start).tolist()


def _transform(train: bool, size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    v2, _ = compat.transforms()  # v2 where torchvision has it, else v1 (same names here)
    if train:
        return v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    return v2.Compose([v2.Resize(round(size / 0.875), antialias=True), v2.CenterCrop(size)])


class JpegFiles(Dataset[tuple[torch.Tensor, int]]):
    """Items are (encoded file bytes, label), or (decoded, transformed uint8 CHW, label)."""

    def __init__(
        self, files: list[str], labels: list[int], decode: bool, train: bool, size: int
    ) -> None:
        self.files = files
        self.labels = labels
        self.decode = decode
        self.transform = _transform(train, size) if decode else None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        raw = read_file(self.files[index])
        if not self.decode:
            return raw, self.labels[index]
        try:
            image = decode_jpeg(raw, mode=ImageReadMode.RGB)
        except RuntimeError as exc:
            raise DataError(f"cannot decode {self.files[index]} as JPEG: {exc}") from exc
        assert self.transform is not None
        return self.transform(image), self.labels[index]


def _collate_raw(items: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [t for t, _ in items], torch.tensor([label for _, label in items], dtype=torch.int64)


class Normalize:
    """uint8 NCHW batch on the device -> normalised float batch in the memory format."""

    def __init__(self, device: torch.device, memory_format: torch.memory_format) -> None:
        self.mean = torch.tensor(_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.inv_std = 1.0 / (torch.tensor(_STD, device=device).view(1, 3, 1, 1) * 255)
        self.memory_format = memory_format

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=self.memory_format).float()
        return (x - self.mean) * self.inv_std


class SyntheticBatches:
    """The same device-resident random batch every step."""

    decoder = "synthetic"
    decode_api: str | None = None

    def __init__(
        self,
        batch_size: int,
        image_size: int,
        num_classes: int,
        device: torch.device,
        memory_format: torch.memory_format,
        seed: int,
    ) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        y = torch.randint(num_classes, (batch_size,), generator=gen)
        self.x = x.to(device).contiguous(memory_format=memory_format)
        self.y = y.to(device)

    def __iter__(self) -> SyntheticBatches:
        return self

    def __next__(self) -> Batch:
        return self.x, self.y

    def close(self) -> None:
        """Nothing to release."""


class LoaderBatches:
    """Batches from a DataLoader, moved to the device (optionally prefetched on CUDA)."""

    def __init__(
        self,
        source: Iterator[Any],
        prepare: Callable[[Any], Batch],
        device: torch.device,
        decoder: str,
        prefetch: int = 2,
        decode_api: str | None = None,
    ) -> None:
        self.decoder = decoder
        self.decode_api = decode_api or decoder
        self._source = source
        self._prepare = prepare
        self._device = device
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if device.type == "cuda" and prefetch > 0:
            self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
            self._stream = torch.cuda.Stream(device)
            self._thread = threading.Thread(target=self._worker, name="prefetch", daemon=True)
            self._thread.start()

    def _worker(self) -> None:  # CUDA only
        torch.cuda.set_device(self._device)
        try:
            with torch.cuda.stream(self._stream):
                for item in self._source:
                    x, y = self._prepare(item)
                    ready = torch.cuda.Event()
                    ready.record(self._stream)
                    while not self._stop.is_set():
                        try:
                            self._queue.put((x, y, ready), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if self._stop.is_set():
                        return
        except BaseException as exc:  # handed to the consumer
            self._queue.put(exc)

    def __iter__(self) -> LoaderBatches:
        return self

    def __next__(self) -> Batch:
        if self._thread is None:
            return self._prepare(next(self._source))
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        x, y, ready = item
        current = torch.cuda.current_stream(self._device)
        current.wait_event(ready)
        x.record_stream(current)
        y.record_stream(current)
        return x, y

    def close(self) -> None:
        """Stop the prefetch thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _loader(
    dataset: Dataset[Any],
    batch_size: int,
    train: bool,
    seed: int,
    workers: int,
    collate: Callable[..., Any] | None,
    pin: bool,
    shard: int,
    shards: int,
) -> Iterator[Any]:
    # map-style datasets have __len__; torch types Dataset without it
    sampler = ForeverSampler(len(dataset), train, seed, shard, shards)  # type: ignore[arg-type]
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        drop_last=True,
        persistent_workers=False,
        prefetch_factor=4 if workers > 0 else None,
    )
    return iter(loader)


def _nvjpeg_prepare(
    device: torch.device, train: bool, size: int, normalize: Normalize
) -> Callable[[Any], Batch]:
    from torchvision.io import ImageReadMode

    transform = _transform(train, size)
    decode = compat.jpeg_decode()

    def prepare(item: tuple[list[torch.Tensor], torch.Tensor]) -> Batch:
        raw, labels = item
        images = decode(raw, ImageReadMode.RGB, str(device))
        x = torch.stack([transform(img) for img in images])
        return normalize(x), labels.to(device, non_blocking=True)

    return prepare


def _dali_batches(  # CUDA + nvidia.dali only; untested on the CPU-only CI machines
    root: str,
    batch_size: int,
    size: int,
    train: bool,
    device: torch.device,
    seed: int,
    workers: int,
    shard: int,
    shards: int,
    memory_format: torch.memory_format,
) -> LoaderBatches:
    from nvidia.dali import fn, pipeline_def, types  # optional extra
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(
            file_root=root,
            random_shuffle=train,
            shard_id=shard,
            num_shards=shards,
            name="Reader",
        )
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        if train:
            images = fn.random_resized_crop(images, size=size)
            mirror = fn.random.coin_flip()
        else:
            images = fn.resize(images, resize_shorter=round(size / 0.875))
            mirror = 0
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            crop=(size, size),
            mean=[m * 255 for m in _MEAN],
            std=[s * 255 for s in _STD],
            mirror=mirror,
        )
        return images, labels.gpu()

    p = pipe(batch_size=batch_size, num_threads=max(workers, 1), device_id=device.index, seed=seed)
    p.build()
    it = DALIGenericIterator(
        [p],
        ["data", "label"],
        reader_name="Reader",
        last_batch_policy=LastBatchPolicy.DROP,
        auto_reset=True,
    )

    def forever() -> Iterator[Any]:
        while True:
            yield from it

    def prepare(item: Any) -> Batch:
        x = item[0]["data"].contiguous(memory_format=memory_format)
        return x, item[0]["label"].view(-1).long()

    return LoaderBatches(forever(), prepare, device, "dali", prefetch=0, decode_api="dali")


def _pick_decoder(device: torch.device) -> str:
    forced = os.environ.get("WORKLOAD_DECODER", "").strip().lower()
    if forced:
        if forced not in ("cpu", "nvjpeg", "dali"):
            raise DataError(f"WORKLOAD_DECODER={forced!r}: use cpu, nvjpeg or dali")
        return forced
    if device.type != "cuda":
        return "cpu"
    try:
        import nvidia.dali  # noqa: F401  (optional extra)
    except Exception:
        return "nvjpeg"
    return "dali"


def image_folder_batches(
    root: str,
    batch_size: int,
    image_size: int,
    train: bool,
    device: torch.device,
    memory_format: torch.memory_format,
    workers: int,
    seed: int,
    shard: int = 0,
    shards: int = 1,
) -> LoaderBatches:
    """Endless device batches from an ImageFolder tree of JPEGs (see the module docstring)."""
    files, labels, _ = find_images(root)
    decoder = _pick_decoder(device)
    if decoder == "dali":
        try:
            return _dali_batches(
                root,
                batch_size,
                image_size,
                train,
                device,
                seed,
                workers,
                shard,
                shards,
                memory_format,
            )
        except Exception as exc:
            log.warning("DALI pipeline failed (%s); using torchvision nvJPEG", exc)
            decoder = "nvjpeg"
    normalize = Normalize(device, memory_format)
    if decoder == "nvjpeg":
        try:
            prepare = _nvjpeg_prepare(device, train, image_size, normalize)
            from torchvision.io import read_file

            prepare(_collate_raw([(read_file(files[0]), labels[0])]))  # fail here, not mid-run
        except Exception as exc:
            log.warning("GPU JPEG decode unavailable (%s); decoding on the CPU", exc)
            decoder = "cpu"
        else:
            dataset = JpegFiles(files, labels, decode=False, train=train, size=image_size)
            source = _loader(
                dataset, batch_size, train, seed, workers, _collate_raw, False, shard, shards
            )
            return LoaderBatches(
                source, prepare, device, "nvjpeg", decode_api=compat.jpeg_decode().label
            )
    dataset = JpegFiles(files, labels, decode=True, train=train, size=image_size)
    pin = device.type == "cuda"
    source = _loader(dataset, batch_size, train, seed, workers, None, pin, shard, shards)

    def prepare_cpu(item: tuple[torch.Tensor, torch.Tensor]) -> Batch:
        x, y = item
        return (normalize(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))

    return LoaderBatches(source, prepare_cpu, device, "cpu", decode_api="decode_jpeg(cpu)")

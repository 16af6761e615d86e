"""The workloads of the end-to-end benchmark: synthetic ones (issue 5) and
real-data ones (issue 16: JPEG files, a Hugging Face table, a torchvision
pipeline, a 1 GiB memmap), their data generated at start, nothing downloaded.

Each workload makes its source arrays, then the dataset a contender loads
them through. Every contender does the same work per sample: the array
workloads index the same arrays, and the augmenting datasets draw their crop
and flip from a generator made per sample, from ``fastload.sample_rng()``
under fastload and from a numpy Generator seeded by the index elsewhere.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._bench.contenders import FASTLOAD_CONTENDERS, MEMCPY, TAKE
from fastload._sample_rng import sample_rng
from fastload.dataset import ArrayDataset

# The augmenting dataset crops CROP x CROP out of SOURCE x SOURCE images.
SOURCE = 72
CROP = 64
# ImageNet's channel statistics, the usual normalisation.
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def _fastload_rng(index: int) -> np.random.Generator:
    return sample_rng()


def _index_rng(index: int) -> np.random.Generator:
    return np.random.default_rng(index)


class AugmentDataset:
    """A map-style dataset doing per-sample Python work: random crop, random
    horizontal flip, normalisation to float32."""

    def __init__(self, images: np.ndarray, labels: np.ndarray,
                 rng_for: Callable[[int], np.random.Generator]) -> None:
        self.images = images
        self.labels = labels
        self.rng_for = rng_for

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        rng = self.rng_for(index)
        top, left = rng.integers(0, SOURCE - CROP + 1, size=2)
        crop = self.images[index, :, top:top + CROP, left:left + CROP]
        if rng.random() < 0.5:
            crop = crop[:, :, ::-1]
        image = (crop.astype(np.float32) * np.float32(1 / 255) - MEAN) / STD
        return image, self.labels[index]


class TensorImageDataset:
    """The torchvision idiom: each sample converted to a torch tensor as
    ``transforms.ToTensor()`` does (HWC uint8 -> CHW float32 in [0, 1]),
    with an int label; the same dataset under every contender."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        import torch  # noqa: F401  (imported here, so no first batch pays for it)

        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch

        image = torch.from_numpy(self.images[index]).permute(2, 0, 1)
        return image.float().div_(255), int(self.labels[index])


class TokenDataset:
    """Variable-length samples: int32 token sequences of lognormal lengths
    (mean about 300, at most 4096) and an int label, sliced from one array;
    torch tensors for torch's loader, numpy arrays for the others."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, labels: np.ndarray,
                 as_tensors: bool) -> None:
        self.tokens = tokens
        self.offsets = offsets
        self.labels = labels
        self.as_tensors = as_tensors

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        tokens = self.tokens[self.offsets[index]:self.offsets[index + 1]]
        if self.as_tensors:
            import torch

            return torch.from_numpy(tokens), int(self.labels[index])
        return tokens, int(self.labels[index])


def torch_pad(batch: list[tuple[Any, int]]) -> tuple[Any, Any, Any]:
    """The padding collate_fn NLP projects write for torch's loader."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    tokens = [sample[0] for sample in batch]
    return (pad_sequence(tokens, batch_first=True, padding_value=0),
            torch.tensor([len(t) for t in tokens]), torch.tensor([s[1] for s in batch]))


def numpy_pad(batch: list[tuple[Any, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same written with numpy, sample by sample, for the Pool baseline."""
    lengths = np.array([len(sample[0]) for sample in batch])
    values = np.zeros((len(batch), int(lengths.max())), dtype=batch[0][0].dtype)
    for row, sample in enumerate(batch):
        values[row, :len(sample[0])] = sample[0]
    return values, lengths, np.array([sample[1] for sample in batch])


def _ragged_collate(contender: str) -> Any:
    if contender in FASTLOAD_CONTENDERS:
        from fastload.ragged import pad_collate

        return pad_collate()
    return torch_pad if contender == "torch" else numpy_pad


# The JPEG workloads: a folder of JPEG_FILES files, sides drawn from
# JPEG_SIDES, each decoded, cropped to a random square of at least half its
# side, resized to JPEG_CROP x JPEG_CROP, flipped half the time and
# normalised: float32 3x224x224 samples of 588 KiB, the ImageNet recipe,
# 32 to a batch of 18 MiB. Few files, so an epoch is four batches and the
# persistent-worker epochs the measurement times cost seconds, not minutes;
# they stay in the page cache, as a dataset read for a second time does.
JPEG_FILES = 128
JPEG_SIDES = (256, 512)
JPEG_CROP = 224


def jpeg_folder() -> str:
    """The folder of generated JPEG files, written once per machine under the
    temporary directory (to a temporary name, then renamed, as the memmap)."""
    folder = os.path.join(tempfile.gettempdir(),
                          f"fastload-bench-jpeg-{JPEG_FILES}-{JPEG_SIDES[0]}-{JPEG_SIDES[1]}")
    if os.path.isdir(folder):
        return folder
    from PIL import Image

    partial = f"{folder}.{os.getpid()}"
    os.makedirs(partial, exist_ok=True)
    rng = np.random.default_rng(0)
    for number in range(JPEG_FILES):
        height, width = rng.integers(JPEG_SIDES[0], JPEG_SIDES[1] + 1, size=2)
        Image.fromarray(_photo_like(rng, int(height), int(width))).save(
            os.path.join(partial, f"{number:05d}.jpg"), quality=90)
    try:
        os.rename(partial, folder)
    except OSError:  # another bench wrote it meanwhile
        shutil.rmtree(partial)
    return folder


def _photo_like(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """An RGB image with the structure that makes JPEG work as on photos
    (smooth gradients, edges of a few shapes, some grain), not noise, which
    no codec compresses."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    colour = rng.uniform(0, 255, (3, 3)).astype(np.float32)
    image = (colour[:, 0, None, None] * (x / width) + colour[:, 1, None, None] * (y / height)
             + colour[:, 2, None, None] * 0.5)
    for _ in range(6):
        cy, cx, radius = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(20, 120)
        inside = (y - cy) ** 2 + (x - cx) ** 2 < radius ** 2
        image[:, inside] = rng.uniform(0, 255, (3, 1))
    image += rng.normal(0, 6, image.shape).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8).transpose(1, 2, 0).copy()


def _jpeg_files() -> tuple[np.ndarray, ...]:
    folder = jpeg_folder()
    paths = np.array(sorted(os.path.join(folder, name) for name in os.listdir(folder)))
    return paths, _labels(len(paths))


class JpegDataset:
    """JPEG files decoded with Pillow, then numpy augmentation: a random
    square crop resized to JPEG_CROP (in Pillow, as torchvision's
    RandomResizedCrop does), a random horizontal flip, normalisation to
    float32 CHW."""

    def __init__(self, paths: np.ndarray, labels: np.ndarray,
                 rng_for: Callable[[int], np.random.Generator]) -> None:
        self.paths = paths
        self.labels = labels
        self.rng_for = rng_for

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        from PIL import Image

        rng = self.rng_for(index)
        with Image.open(self.paths[index]) as image:
            image = image.convert("RGB")
            width, height = image.size
            side = int(rng.integers(min(width, height) // 2, min(width, height) + 1))
            left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            crop = np.asarray(image.resize((JPEG_CROP, JPEG_CROP), Image.Resampling.BILINEAR,
                                           box=(left, top, left + side, top + side)))
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        chw = crop.transpose(2, 0, 1).astype(np.float32) * np.float32(1 / 255)
        return (chw - MEAN) / STD, self.labels[index]


class TorchvisionJpegDataset:
    """The torchvision idiom over the same files: ``decode_jpeg`` to a uint8
    tensor, then ``transforms.v2`` (RandomResizedCrop, RandomHorizontalFlip,
    ToDtype, Normalize); the same dataset under every contender."""

    def __init__(self, paths: np.ndarray, labels: np.ndarray) -> None:
        import torch
        from torchvision.transforms import v2

        self.paths = paths
        self.labels = labels
        self.transform = v2.Compose([
            v2.RandomResizedCrop(JPEG_CROP, antialias=True), v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN.ravel().tolist(), STD.ravel().tolist())])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from torchvision.io import decode_jpeg, read_file

        return self.transform(decode_jpeg(read_file(str(self.paths[index])))), int(self.labels[index])


def _hf_table(contender: str, arrays: tuple[np.ndarray, ...]) -> Any:
    """A Hugging Face ``datasets`` table over the arrays, formatted as torch
    tensors for torch's loader and numpy arrays for the others, each
    loader's natural input; rows are fetched through its ``__getitems__``."""
    import datasets

    features, labels = arrays
    table = datasets.Dataset.from_dict({"features": features, "label": labels})
    return table.with_format("torch" if contender == "torch" else "numpy")


def _table_rows() -> tuple[np.ndarray, ...]:
    count = 16384
    features = np.random.default_rng(0).standard_normal((count, 128), dtype=np.float32)
    return features, _labels(count)


def _tensor_table(contender: str, arrays: tuple[np.ndarray, ...]) -> Any:
    """The arrays as torch tensors: fastload's ArrayDataset over them (the
    migrating user's TensorDataset), torch's TensorDataset elsewhere."""
    import torch
    from torch.utils.data import TensorDataset

    tensors = tuple(torch.from_numpy(a) for a in arrays)
    return ArrayDataset(*tensors) if contender in FASTLOAD_CONTENDERS else TensorDataset(*tensors)


def _fastload_or_index_rng(contender: str) -> Callable[[int], np.random.Generator]:
    return _fastload_rng if contender in FASTLOAD_CONTENDERS else _index_rng


@dataclass(frozen=True)
class Workload:
    """A benchmark workload: its source arrays and how each contender sees them."""

    name: str
    description: str
    batch_size: int
    make_arrays: Callable[[], tuple[np.ndarray, ...]]
    # Whether the loader's work is moving bytes: then memcpy of the same
    # bytes is measured beside it as the bandwidth ceiling.
    bandwidth_bound: bool = False
    augment: bool = False
    # Samples are torch tensors: measured only where torch is installed.
    tensors: bool = False
    # Samples of different lengths: each contender's padding collate_fn.
    ragged: bool = False
    # Beside the loaders, one process's np.take of the same rows (the
    # reference for a loader gathering small rows of an ArrayDataset).
    take_reference: bool = False
    # The modules the workload needs (skipped with a message without them),
    # and, when its dataset is not made from the flags above, how:
    # (contender, arrays) -> dataset.
    needs: tuple[str, ...] = ()
    make_dataset: Callable[[str, tuple[np.ndarray, ...]], Any] | None = None
    # Contenders not measured on this workload (the description says why).
    without: tuple[str, ...] = ()

    @property
    def reference(self) -> str | None:
        """The measurement beside the loaders, when there is one: memcpy for
        a bandwidth-bound workload, np.take for small rows."""
        return MEMCPY if self.bandwidth_bound else TAKE if self.take_reference else None

    def missing(self) -> list[str]:
        """The modules this workload needs that are not installed."""
        return [name for name in self.needs if importlib.util.find_spec(name) is None]

    def collate_fn(self, contender: str) -> Any:
        """The collate_fn ``contender`` loads with (None: its default)."""
        return _ragged_collate(contender) if self.ragged else None

    def dataset(self, contender: str, arrays: tuple[np.ndarray, ...]) -> Any:
        """The dataset ``contender`` loads: fastload's ArrayDataset, torch's
        TensorDataset, or the augmenting dataset with the contender's way of
        drawing per-sample randomness; or what ``make_dataset`` makes."""
        if self.make_dataset is not None:
            return self.make_dataset(contender, arrays)
        if self.augment:
            images, labels = arrays
            return AugmentDataset(images, labels, _fastload_or_index_rng(contender))
        if self.tensors:
            return TensorImageDataset(*arrays)
        if self.ragged:
            tokens, offsets, labels = arrays
            return TokenDataset(tokens, offsets, labels, as_tensors=contender == "torch")
        if contender == "torch":
            import torch
            from torch.utils.data import TensorDataset

            return TensorDataset(*(torch.from_numpy(a) for a in arrays))
        return ArrayDataset(*arrays)


def _labels(count: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 1000, count, dtype=np.int64)


def _rows() -> tuple[np.ndarray, ...]:
    count = 65536
    features = np.random.default_rng(0).standard_normal((count, 64), dtype=np.float32)
    return features, _labels(count)


def _images() -> tuple[np.ndarray, ...]:
    count = 4096
    images = np.random.default_rng(0).integers(0, 256, (count, 3, 64, 64), dtype=np.uint8)
    return images, _labels(count)


def _augment_sources() -> tuple[np.ndarray, ...]:
    count = 2048
    images = np.random.default_rng(0).integers(0, 256, (count, 3, SOURCE, SOURCE),
                                               dtype=np.uint8)
    return images, _labels(count)


def _hwc_images() -> tuple[np.ndarray, ...]:
    count = 4096
    images = np.random.default_rng(0).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
    return images, _labels(count)


def _float_images() -> tuple[np.ndarray, ...]:
    count = 4096
    images = np.random.default_rng(0).standard_normal((count, 3, 32, 32), dtype=np.float32)
    return images, _labels(count)


def _token_sequences() -> tuple[np.ndarray, ...]:
    count, mean, sigma = 8192, 300, 0.8
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, count), 1, 4096)
    offsets = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    tokens = rng.integers(0, 50000, int(offsets[-1]), dtype=np.int32)
    return tokens, offsets, _labels(count)


def _large() -> tuple[np.ndarray, ...]:
    # 128 MiB, far past any cache; filled, so no page is the shared zero page.
    return (np.full((128, 512, 512), 0.5, dtype=np.float32),)


# The memmap workload: rows of 4 KiB in a file of 1 GiB, written once per
# machine (under the temporary directory) and then read through the page
# cache, as a dataset memory-mapped from local disk is.
MEMMAP_ROWS = 1 << 18
MEMMAP_WIDTH = 1024


def memmap_path() -> str:
    return os.path.join(tempfile.gettempdir(),
                        f"fastload-bench-memmap-{MEMMAP_ROWS}x{MEMMAP_WIDTH}.f32")


def _memmap() -> tuple[np.ndarray, ...]:
    """Row i holds the value i everywhere. The file is written to a
    temporary name and renamed, so a bench stopped halfway never leaves a
    short file behind that a later run would take as complete."""
    path, shape = memmap_path(), (MEMMAP_ROWS, MEMMAP_WIDTH)
    if not os.path.exists(path):
        partial = f"{path}.{os.getpid()}"
        rows = np.memmap(partial, np.float32, "w+", shape=shape)
        chunk = 4096
        for start in range(0, MEMMAP_ROWS, chunk):
            stop = min(start + chunk, MEMMAP_ROWS)
            rows[start:stop] = np.arange(start, stop, dtype=np.float32)[:, None]
        rows.flush()
        del rows
        os.replace(partial, path)
    # Copy-on-write: writable for torch.from_numpy, and the file stays as it is.
    return np.memmap(path, np.float32, "c", shape=shape), _labels(MEMMAP_ROWS)


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("rows", "65536 rows of 64 float32 + int64 label (an ArrayDataset of small rows)",
             256, _rows, take_reference=True),
    Workload("images", "4096 uint8 images 3x64x64 + int64 label", 128, _images),
    Workload("augment", "random crop 64 of 72, flip, normalise, per sample in Python", 128,
             _augment_sources, augment=True),
    Workload("large", "128 samples of float32 512x512 (1 MiB)", 32, _large,
             bandwidth_bound=True),
    Workload("tensors", "4096 torch images: uint8 32x32x3 to float32 3x32x32 tensor, "
             "int label, per sample in Python", 128, _hwc_images, tensors=True, needs=("torch",)),
    Workload("tensor-rows", "4096 float32 3x32x32 torch tensors + int64 label tensor: "
             "an ArrayDataset over the tensors (torch's TensorDataset for the others)", 128,
             _float_images, needs=("torch",), make_dataset=_tensor_table),
    Workload("ragged", "8192 int32 token sequences, lognormal lengths (mean 300, max 4096), "
             "padded per batch: fastload.pad_collate against the Python padding collate_fn "
             "of each baseline", 64, _token_sequences, ragged=True),
    Workload("memmap", "np.memmap of 1 GiB on local disk, rows of 1024 float32 + int64 label "
             "(written once under the temporary directory)", 128, _memmap,
             bandwidth_bound=True),
    Workload("jpeg", f"{JPEG_FILES} JPEG files of {JPEG_SIDES[0]}-{JPEG_SIDES[1]} px (written once "
             "under the temporary directory), decoded with Pillow, random crop resized to "
             f"{JPEG_CROP}, flip, normalise to float32 3x{JPEG_CROP}x{JPEG_CROP}", 32, _jpeg_files,
             needs=("PIL",),
             make_dataset=lambda contender, arrays: JpegDataset(
                 arrays[0], arrays[1], _fastload_or_index_rng(contender))),
    Workload("torchvision", "the jpeg files through torchvision: decode_jpeg, transforms.v2 "
             "RandomResizedCrop, flip, ToDtype, Normalize, per sample in torch", 32, _jpeg_files,
             needs=("PIL", "torch", "torchvision"),
             make_dataset=lambda contender, arrays: TorchvisionJpegDataset(arrays[0], arrays[1])),
    Workload("hf", "a Hugging Face datasets table, 16384 rows of 128 float32 + int64 label, "
             "numpy format (torch format for torch's loader); not python-mp, whose forked "
             "Pool hangs on the table", 256, _table_rows,
             needs=("datasets",), make_dataset=_hf_table, without=("python-mp",)),
)}

"""fastload: a numpy-native data loader with the API of torch.utils.data."""
import fastload_c  # noqa: F401  (fails early, with build instructions, if the core is missing)
from fastload._gathered import GatheredBatch
from fastload._sample_rng import sample_rng
from fastload._stats import LoaderStats
from fastload._worker_info import WorkerInfo, get_worker_info
from fastload.bucketing import BucketBatchSampler, PackedBatchSampler
from fastload.collate import default_collate, default_convert
from fastload.dataset import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from fastload.distributed import DistributedSampler, batches_per_rank
from fastload.errors import (
    CollateError,
    FastloadError,
    InvalidArgumentError,
    RingClosedError,
    ShmError,
    StateMismatchError,
    WorkerDiedError,
)
from fastload.loader import DataLoader, StatefulDataLoader
from fastload.ragged import Packed, Padded, pack_collate, pad_collate
from fastload.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__version__ = "0.1.0"

__all__ = [
    "ArrayDataset",
    "BatchSampler",
    "BucketBatchSampler",
    "ChainDataset",
    "CollateError",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "FastloadError",
    "GatheredBatch",
    "InvalidArgumentError",
    "IterableDataset",
    "LoaderStats",
    "Packed",
    "PackedBatchSampler",
    "Padded",
    "RandomSampler",
    "RingClosedError",
    "Sampler",
    "SequentialSampler",
    "ShmError",
    "StateMismatchError",
    "StackDataset",
    "StatefulDataLoader",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerDiedError",
    "WorkerInfo",
    "batches_per_rank",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "pack_collate",
    "pad_collate",
    "random_split",
    "sample_rng",
]

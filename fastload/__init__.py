"""fastload: a numpy-native data loader with the API of torch.utils.data."""
import fastload_c  # noqa: F401  (fails early, with build instructions, if the core is missing)

from fastload._gathered import GatheredBatch
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
from fastload.distributed import DistributedSampler
from fastload.errors import (
    CollateError,
    FastloadError,
    InvalidArgumentError,
    RingClosedError,
    ShmError,
)
from fastload.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__version__ = "0.1.0"

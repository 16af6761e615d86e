"""fastload: a numpy-native data loader with the API of torch.utils.data."""
import fastload_c  # noqa: F401  (fails early, with build instructions, if the core is missing)

__version__ = "0.1.0"

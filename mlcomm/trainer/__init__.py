"""Data-parallel SGD trainer: ``train(...)`` and ``mlcomm train``."""

from .checkpoint import CheckpointError
from .train import TrainConfig, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train", "CheckpointError"]

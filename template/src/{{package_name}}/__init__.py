"""A PyTorch training project rendered by torchfeed."""

__version__ = "0.1.0"

# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""A PyTorch training project rendered by torchfeed."""

__version__ = "0.1.0"

"""Handwritten digits as patch sequences: a small image-classification task that needs no download.

Source: scikit-learn's bundled ``load_digits`` (the UCI optical-recognition test set): 1,797
grey-scale 8x8 images, pixel values 0..16, ten classes. It stands in for the CIFAR/ImageNet
experiments of Hyper-SET (Hu et al. 2025, arXiv:2502.11646, §5.2, App. D.3), which cannot run
offline.

*Patches.* An image is cut into non-overlapping ``p x p`` patches (``p`` divides 8), read in
row-major order of the patch grid; each patch is flattened row-major. With the default ``p = 2``
an image is ``(8/p)^2 = 16`` tokens of ``p^2 = 4`` values. Pixels are scaled to ``[0, 1]``
(divided by 16). There is no CLS token here: a model adds its own, as Hyper-SET's does.

*Split.* Stratified and deterministic: within each class the images are permuted with
``torch.Generator().manual_seed(seed)`` and the first ``round(test_fraction * n_class)`` go to
the test set; each split keeps scikit-learn's original order.

*Layout.* :class:`DigitPatches` (a ``TensorDataset``-like ``Dataset``): ``patches``
``(N, (8/p)^2, p^2)`` in ``dtype`` (float32 by default), ``labels`` int64 ``(N,)``; ``dataset[i]`` is
``(patches[i], labels[i])``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from cemlib.utils import check_positive_int

__all__ = ["image_to_patches", "patches_to_image", "DigitPatches", "DigitSplits", "load_digit_patches"]

IMAGE_SIZE = 8
NUM_CLASSES = 10


def image_to_patches(images: torch.Tensor, p: int) -> torch.Tensor:
    """``(N, H, W)`` -> ``(N, (H/p)(W/p), p*p)``: row-major grid of row-major flattened patches."""
    if images.ndim != 3:
        raise ValueError(f"images must be (N, H, W), got shape {tuple(images.shape)}")
    n, h, w = images.shape
    p = check_positive_int(p, "patch size p")
    if h % p or w % p:
        raise ValueError(f"patch size p={p} must divide the image size {h}x{w}")
    x = images.reshape(n, h // p, p, w // p, p).permute(0, 1, 3, 2, 4)
    return x.reshape(n, (h // p) * (w // p), p * p)


def patches_to_image(patches: torch.Tensor, h: int = IMAGE_SIZE, w: int = IMAGE_SIZE) -> torch.Tensor:
    """Inverse of :func:`image_to_patches`: ``(N, L, p*p)`` -> ``(N, h, w)``."""
    n, L, pp = patches.shape
    p = int(round(pp ** 0.5))
    if p * p != pp or L != (h // p) * (w // p):
        raise ValueError(f"patches of shape {tuple(patches.shape)} do not tile a {h}x{w} image")
    x = patches.reshape(n, h // p, w // p, p, p).permute(0, 1, 3, 2, 4)
    return x.reshape(n, h, w)


class DigitPatches(Dataset):
    """Patch sequences and labels; see the module docstring for the layout."""

    num_classes = NUM_CLASSES

    def __init__(self, patches: torch.Tensor, labels: torch.Tensor):
        if patches.ndim != 3 or len(patches) != len(labels):
            raise ValueError(f"patches must be (N, L, p*p) with N = len(labels), got "
                             f"{tuple(patches.shape)} and {tuple(labels.shape)}")
        self.patches, self.labels = patches, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.patches[i], self.labels[i]


@dataclass
class DigitSplits:
    train: DigitPatches
    test: DigitPatches
    patch_size: int


def load_digit_patches(patch_size: int = 2, test_fraction: float = 0.2, seed: int = 0,
                       dtype: torch.dtype = torch.float32) -> DigitSplits:
    """scikit-learn's digits as ``(N, (8/p)^2, p^2)`` patch sequences with a stratified split."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    bunch = load_digits()
    images = torch.as_tensor(bunch.images, dtype=torch.float64) / 16.0
    labels = torch.as_tensor(bunch.target, dtype=torch.long)
    patches = image_to_patches(images, patch_size).to(dtype)
    g = torch.Generator().manual_seed(int(seed))
    is_test = torch.zeros(len(labels), dtype=torch.bool)
    for c in range(NUM_CLASSES):
        idx = torch.nonzero(labels == c).flatten()
        chosen = idx[torch.randperm(len(idx), generator=g)[: round(test_fraction * len(idx))]]
        is_test[chosen] = True
    return DigitSplits(DigitPatches(patches[~is_test], labels[~is_test]),
                       DigitPatches(patches[is_test], labels[is_test]), patch_size)

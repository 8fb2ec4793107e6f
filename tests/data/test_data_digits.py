"""scikit-learn digits as patch sequences: patch layout, stratified deterministic split."""

import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader

from cemlib.data.digits import image_to_patches, load_digit_patches, patches_to_image


def test_patch_layout_by_hand():
    img = torch.arange(16.0).reshape(1, 4, 4)
    p = image_to_patches(img, 2)
    assert p.shape == (1, 4, 4)
    assert p[0, 0].tolist() == [0, 1, 4, 5]  # top-left patch, row-major inside
    assert p[0, 1].tolist() == [2, 3, 6, 7]  # next patch to the right
    assert p[0, 2].tolist() == [8, 9, 12, 13]  # first patch of the second patch row
    assert torch.equal(patches_to_image(p, 4, 4), img)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_patches_reassemble_the_original_images(p):
    s = load_digit_patches(patch_size=p, dtype=torch.float64)
    bunch = load_digits()
    images = torch.as_tensor(bunch.images, dtype=torch.float64) / 16.0
    assert s.train.patches.shape[1:] == ((8 // p) ** 2, p * p)
    both = torch.cat([patches_to_image(s.train.patches), patches_to_image(s.test.patches)])
    # every image appears exactly once across the two splits, with its label
    key = lambda im, y: (tuple(im.flatten().tolist()), int(y))  # noqa: E731
    ours = sorted(key(im, y) for im, y in zip(both, torch.cat([s.train.labels, s.test.labels])))
    ref = sorted(key(im, y) for im, y in zip(images, torch.as_tensor(bunch.target)))
    assert ours == ref
    assert 0.0 <= both.min() and both.max() <= 1.0


def test_split_is_stratified_deterministic_and_seeded():
    a, b, c = load_digit_patches(seed=0), load_digit_patches(seed=0), load_digit_patches(seed=1)
    assert len(a.train) + len(a.test) == 1797 and len(a.test) == 359
    assert torch.equal(a.test.patches, b.test.patches) and torch.equal(a.train.labels, b.train.labels)
    assert not torch.equal(a.test.patches, c.test.patches)
    counts = torch.bincount(a.test.labels, minlength=10).float()
    total = counts + torch.bincount(a.train.labels, minlength=10)
    assert ((counts - 0.2 * total).abs() <= 0.5).all()  # round(0.2 n_c) per class
    assert a.train.patches.dtype == torch.float32 and a.train.labels.dtype == torch.long


def test_dataloader_and_errors():
    s = load_digit_patches(patch_size=4)
    x, y = next(iter(DataLoader(s.train, batch_size=32, shuffle=False)))
    assert x.shape == (32, 4, 16) and y.shape == (32,)
    with pytest.raises(ValueError, match="p=3"):
        load_digit_patches(patch_size=3)
    with pytest.raises(ValueError, match="test_fraction"):
        load_digit_patches(test_fraction=1.0)
    with pytest.raises(ValueError, match=r"\(N, H, W\)"):
        image_to_patches(torch.zeros(8, 8), 2)

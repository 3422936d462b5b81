import numpy as np
import pytest
import torch
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassCohenKappa,
    MulticlassJaccardIndex,
)

from sciformer.engine.metrics import (
    ConfusionMatrix,
    format_table,
    scores_from_confusion,
)


def _random_preds(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, c, (n,), generator=gen)
    noise = torch.randint(0, c, (n,), generator=gen)
    pred = torch.where(torch.rand(n, generator=gen) < 0.6, target, noise)
    return pred, target


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_match_torchmetrics(seed: int) -> None:
    c = 7
    pred, target = _random_preds(500, c, seed)
    cm = ConfusionMatrix(c)
    for chunk in range(0, 500, 64):  # accumulate over batches
        cm.update(pred[chunk : chunk + 64], target[chunk : chunk + 64])
    scores = cm.compute()
    assert scores.oa == pytest.approx(float((pred == target).double().mean()), abs=1e-12)
    assert scores.aa == pytest.approx(float(MulticlassAccuracy(c, average="macro")(pred, target)), abs=1e-6)
    assert scores.kappa == pytest.approx(float(MulticlassCohenKappa(c)(pred, target)), abs=1e-6)
    assert scores.miou == pytest.approx(float(MulticlassJaccardIndex(c, average="macro")(pred, target)), abs=1e-6)
    per_class = MulticlassAccuracy(c, average=None)(pred, target).numpy()
    np.testing.assert_allclose(scores.per_class_acc, per_class, atol=1e-6)


def test_ignore_index_and_hand_computed_kappa() -> None:
    cm = ConfusionMatrix(2, ignore_index=-1)
    cm.update(torch.tensor([0, 0, 1, 1, 0]), torch.tensor([0, 1, 1, 1, -1]))
    s = cm.compute()
    assert s.confusion.tolist() == [[1, 0], [1, 2]]
    assert s.oa == pytest.approx(3 / 4)
    assert s.aa == pytest.approx((1 + 2 / 3) / 2)
    po, pe = 3 / 4, (1 * 2 + 3 * 2) / 16
    assert s.kappa == pytest.approx((po - pe) / (1 - pe))


def test_absent_class_excluded_from_means() -> None:
    s = scores_from_confusion(np.array([[5, 0, 0], [0, 3, 1], [0, 0, 0]]))
    assert np.isnan(s.per_class_acc[2])
    assert s.aa == pytest.approx((1 + 0.75) / 2)
    text = format_table(s, ["a", "b", "c"], title="t")
    assert "OA" in text and "c" in text.splitlines()[-1]


def test_out_of_range_target_rejected() -> None:
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        ConfusionMatrix(3).update(torch.tensor([0]), torch.tensor([3]))

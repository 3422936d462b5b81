import numpy as np
import pytest
import torch
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassCohenKappa,
    MulticlassJaccardIndex,
)

from sciformer.engine.metrics import (
    MIOU_RULE,
    ConfusionMatrix,
    format_table,
    label_scorer,
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



@pytest.mark.parametrize("pred", [[0, 3], [-1, 0], [0, 7]])
def test_out_of_range_prediction_rejected(pred: list[int]) -> None:
    """A prediction id outside [0, C) once counted in another class's cell (2 * 3 + 3 = cell (3, 0)) or past the matrix."""
    cm = ConfusionMatrix(3)
    with pytest.raises(ValueError, match=r"predictions must lie in \[0, 3\)"):
        cm.update(torch.tensor(pred), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="3 predictions for 2 targets"):
        cm.update(torch.tensor([0, 1, 2]), torch.tensor([2, 1]))
    assert int(cm.matrix.sum()) == 0


def test_miou_rule_hand_computed() -> None:
    """The one mIoU rule: classes absent from targets and predictions are left out; a class
    predicted but never true counts with IoU 0 (torchmetrics macro Jaccard)."""
    # rows = true, cols = pred; class 3 never true but predicted once; class 4 absent from both
    cm = np.array([
        [4, 1, 0, 0, 0],
        [0, 2, 1, 1, 0],
        [1, 0, 3, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
    ])
    s = scores_from_confusion(cm)
    iou = [4 / (5 + 5 - 4), 2 / (4 + 3 - 2), 3 / (4 + 4 - 3), 0 / (0 + 1 - 0)]
    np.testing.assert_allclose(s.per_class_iou[:4], iou)
    assert np.isnan(s.per_class_iou[4])
    assert s.miou == pytest.approx(sum(iou) / 4)  # not / 5 (class 4 counted 0), not / 3 (class 3 dropped)
    assert s.aa == pytest.approx((4 / 5 + 2 / 4 + 3 / 4) / 3)  # recall over classes that occur in the targets
    assert s.oa == pytest.approx(9 / 13)
    # the same matrix through per-point labels, torchmetrics as the oracle
    target = torch.tensor([t for t in range(5) for p in range(5) for _ in range(cm[t, p])])
    pred = torch.tensor([p for t in range(5) for p in range(5) for _ in range(cm[t, p])])
    oracle = MulticlassJaccardIndex(5, average="macro")(pred, target)
    assert s.miou == pytest.approx(float(oracle), abs=1e-6)


def test_label_scorer_matches_confusion_and_names_classes() -> None:
    score = label_scorer(["a", "b", "c"], ignore_index=-1)
    pairs = [(np.array([0, 0, 1, -1]), np.array([0, 1, 1, 2])), (np.array([2, 1]), np.array([0, 1]))]
    out = score(iter(pairs))
    assert out["points"] == 5  # the ignored point is left out
    s = scores_from_confusion(np.array([[1, 1, 0], [0, 2, 0], [1, 0, 0]]))
    assert out["miou"] == pytest.approx(s.miou) and out["oa"] == pytest.approx(3 / 5)
    assert out["per_class"]["c"] == {"accuracy": 0.0, "iou": 0.0, "support": 1}


def test_metrics_json_names_the_rule(tmp_path) -> None:
    import json

    from sciformer.engine.report import write_evaluation

    s = scores_from_confusion(np.array([[1, 0], [1, 2]]))
    write_evaluation(tmp_path, "test", s, ["a", "b"], {})
    payload = json.loads((tmp_path / "metrics.json").read_text())
    assert payload["miou_rule"] == MIOU_RULE and "macro" in MIOU_RULE
    assert [k for k in payload if "iou" in k.lower() and k not in ("miou", "miou_rule")] == []


def test_metrics_json_is_written_last(tmp_path, monkeypatch) -> None:
    """A write that fails part-way leaves no metrics.json (the mark of a whole evaluation)."""
    from sciformer.engine import report

    s = scores_from_confusion(np.array([[1, 0], [1, 2]]))
    real = report.atomic_write_text
    for failing in ("per_class.csv", "confusion_matrix.csv"):
        out = tmp_path / failing

        def write(path, text, _failing=failing):
            if path.name == _failing:
                raise OSError(28, "No space left on device")
            real(path, text)

        monkeypatch.setattr(report, "atomic_write_text", write)
        with pytest.raises(OSError):
            report.write_evaluation(out, "test", s, ["a", "b"], {})
        assert not (out / "metrics.json").exists()
    monkeypatch.setattr(report, "atomic_write_text", real)
    report.write_evaluation(tmp_path / "whole", "test", s, ["a", "b"], {})
    assert sorted(p.name for p in (tmp_path / "whole").iterdir()) == ["confusion_matrix.csv", "metrics.json", "per_class.csv"]

from sciformer.engine.batching import EpochBatchSampler


def test_epoch_order_reproducible_and_resumable() -> None:
    full = list(EpochBatchSampler(103, 10, shuffle=True, seed=3, epoch=2))
    again = list(EpochBatchSampler(103, 10, shuffle=True, seed=3, epoch=2))
    resumed = list(EpochBatchSampler(103, 10, shuffle=True, seed=3, epoch=2, start=4))
    other_epoch = list(EpochBatchSampler(103, 10, shuffle=True, seed=3, epoch=3))
    assert full == again
    assert resumed == full[4:]
    assert full != other_epoch
    assert sorted(i for b in full for i in b) == list(range(103))  # last batch of 3 is kept
    assert [len(b) for b in full] == [10] * 10 + [3]


def test_singleton_batch_dropped_only_in_training() -> None:
    train = list(EpochBatchSampler(21, 10, shuffle=True))
    evaluation = list(EpochBatchSampler(21, 10, shuffle=False, drop_singleton=False))
    assert [len(b) for b in train] == [10, 10]
    assert [len(b) for b in evaluation] == [10, 10, 1]
    assert sorted(i for b in evaluation for i in b) == list(range(21))


def test_ranks_partition_each_global_batch() -> None:
    ranks = [list(EpochBatchSampler(40, 8, shuffle=True, seed=1, rank=r, world_size=2)) for r in range(2)]
    whole = list(EpochBatchSampler(40, 8, shuffle=True, seed=1))
    for b0, b1, g in zip(ranks[0], ranks[1], whole):
        assert sorted(b0 + b1) == sorted(g)
        assert not set(b0) & set(b1)

"""The TensorFlow adapter's CIFAR-10 input order, on the host (numpy only): the
emulation of cifar10_input's string_input_producer and shuffle_batch queue."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from dlbench_runner.runner import adapter_module


@pytest.fixture(scope="module")
def adapter():
    return adapter_module(REPO / "images" / "tensorflow")


def stream(adapter, seed=1, min_after_dequeue=20000):
    return adapter.ShuffleQueueStream(50000, 128, np.random.default_rng(seed), 5, min_after_dequeue)


def test_the_first_batches_come_from_the_files_read_first(adapter):
    """The queue holds 20,000 + 3 x 128 records before the first batch: two whole files
    and the start of a third, in the order string_input_producer shuffled them."""
    s = stream(adapter)
    first = s.next()
    files = set((first // 10000).tolist())
    assert len(first) == 128 and len(files) >= 2
    read = s.queue.tolist() + first.tolist()             # what the queue has seen so far
    assert len(read) == 20384
    order = list(dict.fromkeys(r // 10000 for r in read))    # files in the order read
    assert len(order) == 3 and files <= set(order)
    assert sorted(read) == sorted(set(read))             # no record twice
    third = [r for r in read if r // 10000 == order[2]]
    assert sorted(third) == list(range(order[2] * 10000, order[2] * 10000 + 384))


def test_a_pass_over_the_files_hands_out_each_record_at_most_once(adapter):
    """Records leave the queue at random, but none twice before the files come round again;
    the stream is the same for the same seed and another for another seed."""
    s = stream(adapter)
    drawn = np.concatenate([s.next() for _ in range((50000 - 20384) // 128)])
    assert len(np.unique(drawn)) == len(drawn)
    again = stream(adapter)
    assert np.array_equal(drawn[:1280], np.concatenate([again.next() for _ in range(10)]))
    other = stream(adapter, seed=2)
    assert not np.array_equal(drawn[:128], other.next())
    # a random stream, not the file order: consecutive records rarely follow each other
    assert np.mean(np.diff(drawn) == 1) < 0.01


def test_the_stream_runs_on_across_rounds_of_the_files(adapter):
    s = stream(adapter)
    batches = 3 * 50000 // 128
    drawn = np.concatenate([s.next() for _ in range(batches)])
    counts = np.bincount(drawn, minlength=50000)
    assert len(counts) == 50000 and counts.sum() == batches * 128
    assert counts.min() >= 1 and counts.max() <= 4       # over three rounds and a bit, none skipped


def test_a_queue_larger_than_the_data_set_is_refused(adapter):
    with pytest.raises(ValueError, match="shuffle_queue must be at most the 50000 training images"):
        stream(adapter, min_after_dequeue=50001)

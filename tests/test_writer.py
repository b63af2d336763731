"""The writer's merge policy on its own: which segments a write merges, from the manifest's counts alone."""

from __future__ import annotations

from retriever.versions.manifest import SegmentEntry
from retriever.versions.writer import MergePolicy


def segments(*rows_deleted: tuple[int, int]) -> tuple[SegmentEntry, ...]:
    return tuple(SegmentEntry(f"{number:06d}", rows, deleted) for number, (rows, deleted) in
                 enumerate(rows_deleted, start=1))


def test_few_segments_with_few_deletions_are_left_alone():
    assert MergePolicy().next_merge(segments((100, 0), (50, 14), (10, 2))) is None


def test_a_segment_deleted_past_the_share_is_rewritten_alone():
    assert MergePolicy(tombstone_share=0.3).next_merge(segments((100, 0), (50, 15), (10, 9))) == ["000002"]


def test_too_many_segments_merge_the_adjacent_run_with_fewest_rows():
    policy = MergePolicy(max_segments=3)
    assert policy.next_merge(segments((100, 0), (5, 0), (4, 0), (90, 0), (3, 0))) == ["000003", "000004", "000005"]
    assert policy.next_merge(segments((100, 0), (90, 0), (5, 0), (4, 0), (3, 0))) == ["000003", "000004", "000005"]
    assert policy.next_merge(segments((1, 0), (2, 0), (3, 0), (4, 0))) == ["000001", "000002"]

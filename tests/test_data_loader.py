"""The pretraining loader: views of one clip share its time window, crops hold across frames, photometric
change only on local views; batches are a function of (seed, step) alone: the same with 0 or 2 workers,
split over ranks exactly as one big batch, and resumable at any step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from data_media import read_pattern_index, write_pattern
from levjepa.data import DataConfig, DataError, PretrainLoader, SyntheticConfig, ViewBatch, normalize

SMALL_SYN = SyntheticConfig(size=32, num_frames=8, num_train=48, num_val=8, num_test=8, image_source="digits")


def _syn_cfg(**kw) -> DataConfig:
    base = dict(
        sources=("synthetic",),
        num_frames=8,
        global_size=32,
        local_size=16,
        num_local=2,
        batch_size=4,
        num_workers=0,
        synthetic=SMALL_SYN,
    )
    return DataConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    for i in range(6):
        write_pattern(root / f"clip{i}.mp4", 16 + i)
    return root


def _take(loader, n: int) -> list[ViewBatch]:
    return [next(loader) for _ in range(n)]


def _same(a: ViewBatch, b: ViewBatch) -> bool:
    return (
        all(torch.equal(x, y) for x, y in zip(a.views, b.views, strict=True))
        and torch.equal(a.photometric, b.photometric)
        and torch.equal(a.index, b.index)
        and (a.epoch, a.step) == (b.epoch, b.step)
    )


def test_views_share_the_time_window_and_crops_hold_across_frames(video_dir):
    cfg = DataConfig(
        sources=(str(video_dir),),
        num_frames=6,
        frame_stride=2,
        num_global=2,
        num_local=3,
        global_size=32,
        local_size=16,
        batch_size=3,
        num_workers=0,
    )
    for batch in _take(PretrainLoader(cfg, seed=1), 2):
        glob, local = batch.views
        assert glob.shape == (2, 3, 3, 6, 32, 32) and local.shape == (3, 3, 3, 6, 16, 16)
        for b in range(3):
            windows = [read_pattern_index(v[b]) for v in (*glob, *local)]
            first = windows[0]
            assert first == [first[0] + 2 * k for k in range(6)]  # right frames, in order, at stride 2
            assert all(w == first for w in windows)  # every view: the same time window
            for view in (*glob[:, b], *local[:, b]):
                assert all(torch.equal(view[1:, t], view[1:, 0]) for t in range(6))  # one crop for all frames
            crops = {tuple(v[b, 1:, 0].flatten().tolist()) for v in (*glob, *local)}
            assert len(crops) == 5  # and each view its own crop


def test_photometric_change_only_on_local_views():
    batch = next(PretrainLoader(_syn_cfg(num_local=6, jitter_p=0.5, grayscale_p=0.5), seed=0))
    glob, local = batch.augment_to_device("cpu")
    assert torch.equal(glob, normalize(batch.views[0]))  # global: normalised, never changed
    params = batch.photometric  # [V, B, 6]
    untouched = (params[..., 0] == 0) & (params[..., 5] == 0)
    changed = ~untouched
    assert untouched.any() and changed.any()
    plain = normalize(batch.views[1])
    diff = (local - plain).abs().flatten(2).amax(-1)  # [V, B]
    assert (diff[untouched] == 0).all()
    assert (diff[changed] > 1e-3).all()


def test_same_seed_same_batches_whatever_the_number_of_workers():
    cfg = _syn_cfg()
    ref = _take(PretrainLoader(cfg, seed=7), 4)
    workers = _take(PretrainLoader(replace(cfg, num_workers=2, persistent_workers=True), seed=7), 4)
    assert all(_same(a, b) for a, b in zip(ref, workers, strict=True))
    other = _take(PretrainLoader(cfg, seed=8), 1)[0]
    assert not torch.equal(other.views[0], ref[0].views[0])


def test_two_ranks_see_exactly_one_rank_with_the_double_batch():
    one = _take(PretrainLoader(_syn_cfg(batch_size=8), seed=3), 3)
    r0 = _take(PretrainLoader(_syn_cfg(batch_size=4), seed=3, rank=0, world_size=2), 3)
    r1 = _take(PretrainLoader(_syn_cfg(batch_size=4), seed=3, rank=1, world_size=2), 3)
    for full, a, b in zip(one, r0, r1, strict=True):
        assert torch.equal(full.index, torch.cat([a.index, b.index]))  # distinct shards, together the batch
        for g in range(2):
            assert torch.equal(full.views[g], torch.cat([a.views[g], b.views[g]], dim=1))
        assert torch.equal(full.photometric, torch.cat([a.photometric, b.photometric], dim=1))


def test_resume_at_a_step_continues_the_uninterrupted_sequence_across_epochs():
    cfg = _syn_cfg(batch_size=16)  # 48 clips: 3 batches per epoch
    loader = PretrainLoader(cfg, seed=5)
    assert loader.batches_per_epoch == 3
    run = _take(loader, 8)
    assert [b.epoch for b in run] == [0, 0, 0, 1, 1, 1, 2, 2] and [b.step for b in run] == list(range(8))
    resumed = _take(PretrainLoader(cfg, seed=5, start_step=4), 4)
    assert all(_same(a, b) for a, b in zip(run[4:], resumed, strict=True))
    assert loader.next_step == 8
    expected = {"next_step": 8, "samples_per_epoch": 48, "global_batch": 16, "micro_batches": 1, "batches_per_epoch": 3}
    assert loader.state_dict() == expected


@pytest.mark.parametrize(("batch_size", "world_size", "micro_batches"), [(8, 1, 2), (4, 2, 2), (8, 2, 1)])
def test_epoch_boundaries_do_not_depend_on_the_split_into_ranks_and_micro_batches(
    batch_size, world_size, micro_batches
):
    # 40 clips, 16 per optimizer step: 2 steps per epoch (drop_last on the effective batch), then epoch 1
    # whatever the split; with drop_last per micro-batch 1 rank x 2 x 8 would run 5 micro-batches an epoch
    cfg = _syn_cfg(samples_per_epoch=40)

    def steps(bs: int, world: int, micro: int) -> list[list[tuple[int, int]]]:
        loaders = [
            PretrainLoader(replace(cfg, batch_size=bs), seed=1, rank=r, world_size=world, micro_batches=micro)
            for r in range(world)
        ]
        out = []
        for _ in range(5):
            batches = [next(loader) for _ in range(micro) for loader in loaders]
            out.append(sorted((b.epoch, int(i)) for b in batches for i in b.index))
        return out

    reference = steps(16, 1, 1)
    assert [s[0][0] for s in reference] == [0, 0, 1, 1, 2]
    assert steps(batch_size, world_size, micro_batches) == reference


def test_an_epoch_visits_every_clip_once_in_a_seed_dependent_order():
    loader = PretrainLoader(_syn_cfg(batch_size=16), seed=5)
    source, item = loader.dataset.plan(0)
    assert (source == 0).all() and sorted(item.tolist()) == list(range(48))
    _, item1 = loader.dataset.plan(1)
    assert sorted(item1.tolist()) == list(range(48)) and not torch.equal(item, item1)


def test_mixture_weights_are_exact_quotas_and_small_sources_cycle(video_dir):
    cfg = _syn_cfg(sources=("synthetic", str(video_dir)), weights=(1.0, 3.0), samples_per_epoch=40)
    loader = PretrainLoader(cfg, seed=0)
    source, item = loader.dataset.plan(0)
    assert int((source == 0).sum()) == 10 and int((source == 1).sum()) == 30
    videos = item[source == 1].tolist()  # 30 positions over 6 videos: 5 full permutations
    assert all(videos.count(v) == 5 for v in range(6))
    assert sorted(videos[:6]) == list(range(6))
    batch = next(loader)
    assert batch.views[0].shape == (1, 4, 3, 8, 32, 32)


def test_an_epoch_smaller_than_the_global_batch_is_refused():
    with pytest.raises(DataError, match="smaller than one optimizer step's batch"):
        PretrainLoader(_syn_cfg(batch_size=32), seed=0, world_size=2)


def test_reverse_p_plays_whole_clips_backwards_with_the_same_crops_and_colours(video_dir):
    cfg = DataConfig(sources=(str(video_dir),), num_frames=6, frame_stride=2, num_local=2, global_size=32,
                     local_size=16, batch_size=6, num_workers=0)  # fmt: skip
    forward = next(PretrainLoader(cfg, seed=3))
    backward = next(PretrainLoader(replace(cfg, reverse_p=1.0), seed=3))
    for a, b in zip(forward.views, backward.views, strict=True):
        assert torch.equal(a.flip(3), b)  # [V, B, C, T, H, W]: each view, its frames in reverse order
    assert torch.equal(forward.photometric, backward.photometric)
    for b in range(6):
        window = read_pattern_index(backward.views[0][0, b])
        assert window == [window[0] - 2 * k for k in range(6)]
    half = next(PretrainLoader(replace(cfg, reverse_p=0.5), seed=3))
    reversed_clips = [torch.equal(half.views[0][0, b], backward.views[0][0, b]) for b in range(6)]
    assert any(reversed_clips) and not all(reversed_clips)  # a per-clip coin
    with pytest.raises(ValueError, match="reverse_p"):
        replace(cfg, reverse_p=1.5)

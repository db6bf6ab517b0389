"""Sources: V-JEPA index files (with image rows), recursive folders, single files, images as clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from data_media import read_uniform, write_uniform
from levjepa.data import DataConfig, DataError, MediaItem, PretrainLoader, list_media, load_image, parse_index
from levjepa.data.loader import PretrainDataset


def test_vjepa_index_rows_with_labels_relative_paths_and_image_rows(tmp_path):
    (tmp_path / "sub").mkdir()
    index = tmp_path / "sub" / "train.csv"
    index.write_text(
        "# comment line\n"
        "/data/k400/abseiling/clip_001.mp4 0\n"
        "\n"
        "videos/b.webm 17\n"
        "../frames/photo.JPG 3\n"
        "/data/with space/clip.mkv 5\n"
        "no_label.avi\n"
    )
    items = parse_index(index)
    assert items == [
        MediaItem("/data/k400/abseiling/clip_001.mp4", 0, "video"),
        MediaItem(str(tmp_path / "sub" / "videos" / "b.webm"), 17, "video"),
        MediaItem(str(tmp_path / "frames" / "photo.JPG"), 3, "image"),
        MediaItem("/data/with space/clip.mkv", 5, "video"),
        MediaItem(str(tmp_path / "sub" / "no_label.avi"), None, "video"),
    ]
    assert list_media(str(index)) == items


def test_folder_is_recursive_sorted_skips_hidden_and_labels_by_subfolder(tmp_path):
    for rel in ("cats/b.mp4", "cats/deep/a.MOV", "dogs/x.png", "dogs/.partial.mp4", ".cache/y.mp4", "dogs/notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    items = list_media(str(tmp_path))
    assert [(i.path[len(str(tmp_path)) + 1 :], i.label, i.kind) for i in items] == [
        ("cats/b.mp4", 0, "video"),
        ("cats/deep/a.MOV", 0, "video"),
        ("dogs/x.png", 1, "image"),
    ]
    (tmp_path / "loose.mp4").write_bytes(b"x")  # a file at the top level: no class structure, no labels
    assert all(i.label is None for i in list_media(str(tmp_path)))
    single = list_media(str(tmp_path / "loose.mp4"))
    assert single == [MediaItem(str(tmp_path / "loose.mp4"), None, "video")]
    with pytest.raises(DataError, match="missing"):
        list_media(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="synthetic"):
        list_media("synthetic")


def test_images_are_clips_repeated_along_time(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    img = load_image(tmp_path / "a.png")
    assert torch.equal(img, torch.from_numpy(pixels))  # PNG is lossless
    assert load_image(tmp_path / "a.png", short_side=20).shape == (20, 30, 3)
    cfg = DataConfig(sources=(str(tmp_path),), num_frames=5, global_size=24, local_size=12, batch_size=1, num_workers=0)
    batch = next(PretrainLoader(cfg, seed=0))
    glob, local = batch.views
    for view in (*glob[:, 0], *local[:, 0]):
        assert all(torch.equal(view[:, t], view[:, 0]) for t in range(5))  # a still clip
    assert glob[0, 0].float().std() > 10  # and not a blank one


def test_index_and_folder_sources_mix_videos_and_images(tmp_path):
    write_uniform(tmp_path / "v.mp4", 30)
    Image.fromarray(np.full((48, 64, 3), 200, np.uint8)).save(tmp_path / "i.jpg")
    index = tmp_path / "index.txt"
    index.write_text("v.mp4 1\ni.jpg 2\n")
    cfg = DataConfig(sources=(str(index),), num_frames=4, global_size=16, local_size=8, batch_size=2, num_workers=0)
    batch = next(PretrainLoader(cfg, seed=0))
    kinds = set()
    for b in range(2):
        frames = batch.views[0][0, b].permute(1, 2, 3, 0)
        if (frames.float().mean(dim=(1, 2, 3)) - 200).abs().max() < 3:
            kinds.add("image")
        else:
            idx = read_uniform(frames)
            assert idx == [idx[0] + 2 * k for k in range(4)]
            kinds.add("video")
    assert kinds == {"image", "video"}


def test_an_index_with_class_name_labels_is_read_with_its_label_map(tmp_path):
    from levjepa.data.sources import read_index_labels

    train = tmp_path / "train.txt"
    train.write_text("clips/a.mp4 right\nclips/b.mp4 left\nclips/c d.mp4 left\n")
    items, classes = read_index_labels(train)
    assert classes == {"left": 0, "right": 1}
    assert [(Path(it.path).name, it.label) for it in items] == [("a.mp4", 1), ("b.mp4", 0), ("c d.mp4", 0)]
    # without a shared map the names get no number: a split numbered alone could disagree with another
    assert [it.label for it in parse_index(train)] == [None, None, None] and len(list_media(str(train))) == 3
    val = tmp_path / "val.txt"
    val.write_text("clips/e.mp4 up\nclips/f.mp4 right\n")
    items, merged = read_index_labels(val, classes)  # the training split's numbers, a new name after them
    assert merged == {"left": 0, "right": 1, "up": 2} and [it.label for it in items] == [2, 1]
    ints = tmp_path / "ints.txt"
    ints.write_text("clips/a.mp4 3\nclips/my video.mp4\n")
    items, none = read_index_labels(ints)
    assert none is None and [it.label for it in items] == [3, None] and items[1].path.endswith("my video.mp4")
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("clips/a.mp4 3\nclips/b.mp4 left\n")
    with pytest.raises(DataError, match=r"line 2: .* mixes integer labels and class names"):
        read_index_labels(mixed)


def _linked_folder(tmp_path: Path) -> Path:
    """A source whose 3 real videos are reachable by many paths: a link loop back to the top, a link to a
    folder inside the source, a linked and a hard-linked copy of a file, and two links to one outside folder."""
    root, outside = tmp_path / "src", tmp_path / "outside"
    (root / "cats").mkdir(parents=True)
    (root / "dogs").mkdir()
    outside.mkdir()
    write_uniform(root / "cats" / "a.mp4", 8)
    write_uniform(root / "dogs" / "d.mp4", 8)
    write_uniform(outside / "x.mp4", 8)
    (root / "cats" / "loop").symlink_to(root)  # cats/loop/cats/loop/... forty levels deep without the check
    (root / "aaa").symlink_to(root / "dogs", target_is_directory=True)  # sorts before the folder it names
    (root / "cats" / "b_link.mp4").symlink_to(root / "cats" / "a.mp4")
    (root / "cats" / "hard.mp4").hardlink_to(root / "cats" / "a.mp4")
    (root / "ext").symlink_to(outside, target_is_directory=True)
    (root / "ext2").symlink_to(outside, target_is_directory=True)
    return root


def test_a_folder_is_walked_once_per_real_file_and_one_line_says_how_many_paths_were_skipped(tmp_path, capsys):
    root = _linked_folder(tmp_path)
    items = list_media(str(root))
    assert [(Path(i.path).relative_to(root).as_posix(), i.label) for i in items] == [
        ("cats/a.mp4", 0),
        ("dogs/d.mp4", 1),
        ("ext/x.mp4", 2),
    ]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{root}: 5 path(s) skipped that reach a file or folder listed already" in err
    # what trains reads the same files
    loader_items = PretrainDataset(DataConfig(sources=(str(root),)), seed=0).sources[0].items
    assert loader_items == items


def test_data_check_and_extract_count_each_real_file_once(tmp_path, capsys):
    from levjepa.cli import main
    from levjepa.data.eval_clip import ViewSpec
    from levjepa.features.extract import ExtractConfig, extract
    from levjepa.formats.reading.load import random_encoder
    from levjepa.model import encoder_config

    root = _linked_folder(tmp_path)
    assert main(["data", "check", str(root), "--workers", "1"]) == 0
    said = capsys.readouterr()
    assert "files: 3 (3 videos, 0 images); readable: 3" in said.out and "5 path(s) skipped" in said.err
    encoder = random_encoder(encoder_config("vit-test")).encoder
    cfg = ExtractConfig(ViewSpec(size=16, frames=4, frame_stride=2), stride=4)
    result = extract(encoder, str(root), tmp_path / "features", cfg, progress=False)
    assert result.files == 3 and result.bad_files == 0 and "5 path(s) skipped" in capsys.readouterr().err


def test_a_link_to_a_hidden_folder_inside_the_source_is_the_way_in(tmp_path, capsys):
    root = tmp_path / "src"
    (root / ".store").mkdir(parents=True)
    (root / ".store" / "h.mp4").write_bytes(b"x")
    (root / "shown").symlink_to(root / ".store", target_is_directory=True)
    assert [Path(i.path).relative_to(root).as_posix() for i in list_media(str(root))] == ["shown/h.mp4"]
    assert capsys.readouterr().err == ""  # nothing skipped, nothing said

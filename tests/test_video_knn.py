"""The public real-video kNN protocol (issue 65, ``levjepa.eval.video_knn``): the frames it reads, k-NN and the
nearest centroid on hand-computed cases, and the pipeline reading exactly those frames."""

from __future__ import annotations

import math

import numpy as np
import torch

from levjepa.data.sources import parse_index
from levjepa.eval.knn import knn_predict
from levjepa.eval.video_knn import centroid_predict, linspace_indices, load_linspace_clip, video_knn
from levjepa.infer.encode import encode
from test_feature_store import _encoder, make_media


def test_frames_are_rounded_linspace_over_the_whole_video():
    for total in (16, 17, 40, 100, 301):
        assert linspace_indices(total) == np.round(np.linspace(0, total - 1, 16)).astype(int).tolist()
    assert linspace_indices(100)[:4] == [0, 7, 13, 20] and linspace_indices(100)[-1] == 99
    assert linspace_indices(5) == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4]  # short: frames repeat


def test_knn_and_centroid_on_a_hand_computed_case():
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -0.2]])
    labels = torch.tensor([0, 0, 1])
    q = torch.tensor([[1.0, 0.05]])
    # centroids: normalize((1, 0) + (0, 1)) = (0.707, 0.707) for class 0, (0.981, -0.196) for class 1;
    # the query's cosines 0.742 and 0.971: the centroid says 1
    assert centroid_predict(gallery, labels, q).tolist() == [1]
    # k = 20 (all three): exp(0.9988 / 0.07) + exp(0.0499 / 0.07) for class 0 against exp(0.9690 / 0.07): 0
    sims = torch.nn.functional.normalize(gallery, dim=1) @ torch.nn.functional.normalize(q, dim=1)[0]
    votes0 = math.exp(sims[0] / 0.07) + math.exp(sims[1] / 0.07)
    assert votes0 > math.exp(sims[2] / 0.07)
    assert knn_predict(gallery, labels, q, k=20, temperature=0.07).tolist() == [0]
    # the weights matter: two far class-1 points cannot outvote one near class-0 point at T = 0.07
    far = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.6, 0.8]])
    assert knn_predict(far, torch.tensor([0, 1, 1]), q, k=3, temperature=0.07).tolist() == [0]
    assert knn_predict(far, torch.tensor([0, 1, 1]), q, k=3, temperature=10.0).tolist() == [1]  # ~ a plain vote


def test_a_class_missing_from_the_gallery_is_never_the_centroid():
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pred = centroid_predict(gallery, torch.tensor([0, 2]), torch.tensor([[0.1, 1.0], [1.0, 0.0]]), 3)
    assert pred.tolist() == [2, 0]


def test_the_protocol_reads_the_linspace_frames(tmp_path, one_thread):
    items = [
        it
        for it in parse_index(make_media(tmp_path, videos=4, images=0))
        if it.path.endswith(".mp4") and "broken" not in it.path and "missing" not in it.path
    ]
    enc = _encoder()
    res = video_knn(enc, items, items, size=16, feature="cls")
    assert res.gallery == res.queries == len(items) and res.k == 20
    clip = load_linspace_clip(items[1].path, 16, 8)
    assert clip.shape == (16, 16, 16, 3)
    direct = encode(enc, clip.permute(3, 0, 1, 2)[None], "cpu").cls
    # gallery = queries: every query's own clip is its nearest centroid's member, and its feature is exact
    from levjepa.eval.video_knn import _features

    feats = _features(enc, items, 16, "cls", "cpu")
    torch.testing.assert_close(feats[1:2], direct)
    assert 0 <= res.knn <= 100 and 0 <= res.centroid <= 100


def test_the_command_writes_a_result_it_can_replace_and_refuses_what_it_would_not_read(tmp_path, capsys, one_thread):
    """``probe --protocol video-knn`` prints its table and writes ``accuracy`` and ``results`` (a rerun with
    ``--overwrite`` recognises its own file); an option it would leave unread is one line, never ignored."""
    import json

    from levjepa.cli import main
    from test_classify import write_index
    from test_export import make_run_dir

    media = tmp_path / "media"
    gallery, queries = write_index(media, "train", 6, 0), write_index(media, "val", 4, 1)
    run = make_run_dir(tmp_path, steps=(5,))
    base = ["probe", str(run), "--task", f"index:{gallery},{queries}", "--protocol", "video-knn", "--no-baseline"]
    base += ["--no-save", "--size", "16"]
    out = tmp_path / "r.json"
    assert main([*base, "--out", str(out)]) == 0
    assert "Video kNN protocol" in capsys.readouterr().out
    first = json.loads(out.read_text())
    assert set(first["accuracy"]["pretrained-ema"]) == {"knn", "centroid"}
    assert first["results"]["pretrained-ema"]["feature"] == "cls" and first["results"]["pretrained-ema"]["queries"] == 4
    assert main([*base, "--out", str(out), "--overwrite", "--knn-feature", "mean"]) == 0
    assert json.loads(out.read_text())["results"]["pretrained-ema"]["feature"] == "mean"
    capsys.readouterr()
    for bad in (["--frames", "8"], ["--seeds", "3"], ["--grid", "vjepa2"], ["--tokens", "int8"], ["--online"]):
        assert main([*base, *bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("levjepa probe: ") and bad[0] in err[0] and "video-knn" in err[0]
    task = ["probe", str(run), "--task", f"index:{gallery},{queries}", "--no-save", "--knn-feature", "mean"]
    assert main(task) == 2
    assert "with --protocol video-knn only" in capsys.readouterr().err

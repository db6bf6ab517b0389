"""``levjepa probe RUN_OR_CHECKPOINT``: frozen-probe accuracy, with the random-initialisation baseline beside.

Tasks (``--task``):

* ``appearance,motion,arrow`` (any subset): the built-in benchmark, with the benchmark config the run
  trained with (``config.json`` → ``data.synthetic``) unless overridden with ``--synthetic key=value``;
* ``index:TRAIN,VAL[,TEST]``: a user's labelled split files — V-JEPA index files (``path label`` rows;
  images allowed), Kinetics CSVs or Something-Something v2 JSONs (``--video-root``, ``--labels-file``).
  Each clip is the centre window of ``--frames`` frames at ``--frame-stride``, resized to a short side of
  ``--size`` and centre-cropped (images: the frame repeated), unless ``--protocol ssv2|k400|in1k|diving48``
  sets frames, stride, resolution and the test views (``levjepa.eval.protocols``). Features stream to
  feature stores under ``--features`` (decoded by ``--workers`` processes, sharded over ``torchrun`` ranks,
  resumed when run again) and the probes train from disk in bounded memory
  (``levjepa.eval.dataset_task``). Without TEST the numbers are validation accuracies of the probe chosen
  on that same validation split (optimistic; the caption says so). Unreadable files are skipped and listed
  in ``bad_files.json`` beside ``--out``. Splits that share files are refused before anything is decoded
  (``--allow-shared-files`` runs them, and the caption says so). ``SIGTERM`` / ``SIGUSR1`` stop the command
  with exit status 75 and one line; the same command continues from the stores and from the probes finished
  before the signal (``levjepa.eval.probe_records``).

**Training views** (index task; ``--train-views``): ``online`` is the reference protocol — V-JEPA's frozen
evaluation re-runs the frozen encoder every epoch on a new view drawn by its training transform
(``levjepa.data.clip_augment``: RandAugment ``rand-m7-n4-mstd0.5-inc1``, random resized crop 8–100 %, random
erasing, no flip, V-JEPA 2's temporal starts); ``K`` keeps K such views per video in the store (epoch e reads view
e mod K); ``fixed`` one centre crop per segment, encoded once. ``--online`` is ``--train-views online``. The
default is the protocol's (``levjepa.eval.protocols``), else ``fixed``; the table's caption names the views and
the transform. ``--seeds N`` trains seeds seed … seed+N−1 in one pass, each its own run (its own initialisation,
batch order and, with augmented views, its own views), and reports mean ± sd. ``--grid vjepa2`` trains V-JEPA
2's 20 attentive heads with its schedules and prints its report (the best head on the evaluation split) beside
levjepa's (the head chosen on val). ``--protocol video-knn --task index:GALLERY,QUERY`` trains nothing: 16
frames by linspace over each whole video, CLS (``--knn-feature mean``: the token mean), k-NN (k = 20, weights
``exp(sim / 0.07)``) and nearest-centroid accuracy of the queries (docs/evaluation.md).

``--weights ema|online|both`` picks the checkpoint's weights (an export holds one set); the table adds
``random-init``: the same architecture at random initialisation (``--baseline-seed``), unless
``--no-baseline``. ``--layers`` reads other blocks than the last, every column alike (``5,11,17,23``: concatenated
on channels, V-JEPA 2.1's hierarchical readout; ``levjepa.model.readout_layers``): the stores, caches and kept
probes are the readout's own. ``--probe attentive,linear,knn`` or ``all``; ``--probe-depth 4`` switches the attentive
probe to V-JEPA 2's 4-block variant. ``--budget demo|full`` sets the grid and (built-in benchmark) the
split sizes; ``--set epochs=5`` etc. overrides the probe config. Prints the table; ``--out`` writes JSON
with every probe of every grid.

The probe chosen for each task is kept (``levjepa.eval.kept_probes``): ``--probes-dir`` (default
``RUN/probes`` for a run, checkpoint or export directory, else ``probes/`` beside ``--out``) gets
``<task>/<probe>/`` per probe, a classifier that ``levjepa classify DIR VIDEOS`` runs; ``--save-all`` keeps
every probe of the grid too, ``--no-save`` none.

Like ``pretrain``, this command only resolves its arguments (the encoders, the task, an ``EvalConfig``),
calls the library and reports: both kinds of task go through the one harness, ``levjepa.eval.harness.evaluate``,
and the chosen probes are kept by ``levjepa.eval.harness.keep_probes``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Literal

from levjepa import distributed
from levjepa.commands._device import add_device_argument, setup_device
from levjepa.commands._images import add_image_frames_argument, image_frames
from levjepa.commands._layers import add_layers_argument, with_layers
from levjepa.commands._outputs import claim_file, claim_folder, claim_outside_owned, is_json_with
from levjepa.config import ConfigError, apply_overrides
from levjepa.data import BadFileReport
from levjepa.eval.config import EvalConfig, probe_names
from levjepa.eval.dataset_task import DatasetTask, dataset_task
from levjepa.eval.harness import Task, evaluate, keep_probes, kept_columns
from levjepa.eval.kept_probes import check_probe_dir
from levjepa.eval.plan import plan
from levjepa.eval.probes import GRIDS, probe_config
from levjepa.eval.protocols import PROTOCOLS, TrainViews, parse_slots, parse_train_views, read_labelled
from levjepa.eval.result import EvalResult
from levjepa.eval.synthetic_task import SYNTHETIC_TITLE, TASKS, synthetic_config_for, synthetic_splits
from levjepa.eval.video_knn import video_knn
from levjepa.formats.reading.classifier import is_classifier
from levjepa.formats.reading.load import LoadedEncoder, load_encoder, random_like
from levjepa.formats.reading.views import model_preprocessing, model_views
from levjepa.model.readout_layers import layers_text
from levjepa.train.preemption import StopSignals, stop_now_on_signals
from levjepa.weights import BAD_FILES, write_json

__all__ = ["add_arguments", "main"]


def _split_list(text: str, valid: tuple[str, ...], what: str) -> list[str]:
    items = list(valid) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        raise ConfigError(f"--{what} {text!r}: valid choices are {', '.join(valid)} or all")
    return items


def _check_protocol_options(args: argparse.Namespace) -> None:
    """A protocol sets the size and the frames (its slots × the tubelet), V-JEPA 2's slots the sampling too: an
    option they would overrule is refused rather than dropped; ``--slots`` means nothing without a protocol."""
    if args.protocol is None:
        if args.slots is not None:
            raise ConfigError("--slots: with --protocol only (without one, --frames sets the clip)")
        return
    given = [f"--{k.replace('_', '-')}" for k in ("size", "frames") if getattr(args, k) is not None]
    if args.slots == "vjepa2":
        given += [f"--{k.replace('_', '-')}" for k in ("frame_stride", "fps") if getattr(args, k) is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: --protocol {args.protocol} sets the size and frames (--slots: temporal positions "
            "per clip), and --slots vjepa2 the sampling too; leave them out, or drop --protocol"
        )


def _train_views(args: argparse.Namespace) -> TrainViews:
    """The probes' training views: ``--train-views``, ``--online`` (its other spelling), else the protocol's."""
    given = None if args.train_views is None else parse_train_views(args.train_views)
    if args.online and given not in (None, "online"):
        raise ConfigError(
            f"--online and --train-views {args.train_views}: --online is --train-views online (a new view every "
            "epoch, none stored); choose one"
        )
    if args.online:
        return "online"
    if given is not None:
        return given
    return PROTOCOLS[args.protocol].train_views if args.protocol else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run directory, checkpoint or export")
    parser.add_argument(
        "--task", default="appearance,motion,arrow", help="appearance,motion,arrow (any) or index:TRAIN,VAL[,TEST]"
    )
    parser.add_argument(
        "--weights",
        choices=("ema", "online", "both"),
        default="ema",
        help="the checkpoint's weights: the EMA copy, the trained (online) weights, or both as two columns (not the "
        "training views: --train-views online)",
    )
    parser.add_argument("--probe", default="all", help="attentive,linear,knn (any) or all")
    parser.add_argument(
        "--probe-depth", type=int, choices=(1, 4), default=1, help="attentive blocks: 1 paper, 4 V-JEPA 2"
    )
    parser.add_argument(
        "--budget",
        choices=("demo", "full"),
        default="demo",
        help="the probes' grid and epochs: demo (attentive 2 lr x 2 wd heads, 20 epochs, chosen by val loss; the "
        "built-in benchmark's small splits) or full (V-JEPA 2's 5 lr x 4 wd values, 20 epochs, chosen by val accuracy)",
    )
    parser.add_argument(
        "--grid",
        choices=GRIDS,
        default=None,
        help="attentive grid: the budget's, or vjepa2 (V-JEPA 2's 20 heads and schedules; the table adds V-JEPA 2's "
        "report, the best head on the evaluation split). Default: the protocol's with --budget full, else budget",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="probe config override")
    parser.add_argument("--synthetic", action="append", default=[], metavar="KEY=VALUE", help="benchmark override")
    parser.add_argument("--baseline-seed", type=int, default=0, help="seed of the random-init baseline")
    parser.add_argument("--no-baseline", action="store_true", help="skip the random-init column")
    parser.add_argument(
        "--protocol",
        choices=(*PROTOCOLS, "video-knn"),
        default=None,
        help="index task: a standard protocol; video-knn: --task index:GALLERY,QUERY, 16 frames by linspace over the "
        "whole video, k-NN (k 20) and nearest-centroid accuracy, nothing trained (docs/evaluation.md)",
    )
    parser.add_argument(
        "--knn-feature",
        choices=("cls", "mean"),
        default=None,
        help="--protocol video-knn: the feature its k-NN and centroids read, CLS (default) or the mean of the tokens",
    )
    parser.add_argument("--video-root", default=None, help="index task: folder of the videos of a K400 CSV / SSv2 JSON")
    parser.add_argument("--labels-file", default=None, help="index task: SSv2's something-something-v2-labels.json")
    parser.add_argument(
        "--features", default=None, help="index task: feature store folder (default: features/ beside --out, or ./)"
    )
    parser.add_argument("--workers", type=int, default=2, help="index task: decoding processes")
    parser.add_argument("--frames", type=int, default=None, help="index task: frames per clip (default: the model's)")
    parser.add_argument(
        "--frame-stride", type=int, default=None, help="index task: keep every n-th frame (default: the model's)"
    )
    parser.add_argument(
        "--fps", type=float, default=None, help="index task: frames per second (default: the model's rate, if any)"
    )
    parser.add_argument("--size", type=int, default=None, help="index task: short side + crop (default: the model's)")
    parser.add_argument(
        "--slots",
        default=None,
        help="with --protocol: temporal positions per clip, 8 (the paper's matched evaluation, default), 16, or "
        "vjepa2 (V-JEPA 2's 16 frames)",
    )
    parser.add_argument(
        "--name", default=None, help="index task: its name, for the table and RUN/probes/NAME (default: from TRAIN)"
    )
    parser.add_argument(
        "--allow-shared-files",
        action="store_true",
        help="index task: evaluate splits that share files (refused otherwise: a probe scored on files it trained on)",
    )
    parser.add_argument(
        "--train-views",
        default=None,
        metavar="online|fixed|K",
        help="index task: the probes' training views. online: the reference protocol (V-JEPA's frozen evaluation): "
        "the attentive probe's tokens encoded every epoch from a new view drawn by V-JEPA's training transform "
        "(RandAugment rand-m7-n4-mstd0.5-inc1, random resized crop 8-100 %%, random erasing, no flip), none stored; "
        "K: K such views per video kept in the store, epoch e reads view e mod K; fixed (= 0): one centre crop per "
        "segment, encoded once (cheapest; not the reference protocol). Default: the protocol's, else fixed "
        "(docs/evaluation.md, bench/eval.md)",
    )
    parser.add_argument("--online", action="store_true", help="index task: the same as --train-views online")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="index task: print the disk, encoder passes and estimated time of this evaluation, then stop",
    )
    parser.add_argument(
        "--tokens",
        default="full",
        help="what the attentive probe reads of the tokens: full (float16), or a compact store: pool2 (2×2 spatial "
        "pooling), tpool2 / tpool3 (2 or 3 temporal slots averaged), last (the last temporal slot), int8, int4 or "
        "int4g32 (8- or 4-bit tokens; g32: a scale per 32 channels), joined by '-': tpool3-int4g32 is the one "
        "recommended (docs/evaluation.md); a store's codec, so not with --train-views online",
    )
    add_image_frames_argument(parser, "repeat (index task)")
    add_layers_argument(parser)
    parser.add_argument("--batch-size", type=int, default=8, help="clips per encoder forward")
    parser.add_argument("--cache", default=None, help="feature cache folder")
    add_device_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="probe seed")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="probe seeds seed..seed+N-1 trained in one pass (each its own run); the table gives mean ± sd",
    )
    parser.add_argument("--out", default=None, help="write the JSON result here")
    parser.add_argument("--probes-dir", default=None, help="where the kept probes go (default: RUN/probes)")
    parser.add_argument("--save-all", action="store_true", help="keep every probe of the grid, not only the chosen")
    parser.add_argument("--no-save", action="store_true", help="keep no probe")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the JSON result at --out and the probes kept there before"
    )


def main(args: argparse.Namespace) -> int:
    _, args.device = setup_device(args.device)  # torchrun: one process per GPU
    try:
        return _main(args)
    finally:
        distributed.teardown()


def _check_options(args: argparse.Namespace) -> None:
    """Options that cannot both hold, or that write nothing as given: refused in one line."""
    if args.no_save and args.save_all:
        raise ConfigError("--no-save keeps no probe and --save-all keeps every one: choose one of the two")
    if args.no_save and args.probes_dir:
        raise ConfigError("--probes-dir: where kept probes go, and --no-save keeps none: drop one of the two")
    if args.plan:
        given = [o for o, v in (("--out", args.out), ("--probes-dir", args.probes_dir)) if v]
        given += [o for o, v in (("--save-all", args.save_all), ("--overwrite", args.overwrite)) if v]
        if given:
            raise ConfigError(f"{', '.join(given)}: --plan prints the plan and stops, writing nothing; drop them")
    if args.knn_feature is not None and args.protocol != "video-knn":
        raise ConfigError(
            f"--knn-feature {args.knn_feature}: with --protocol video-knn only (the kNN probe of a task reads CLS)"
        )
    if args.overwrite and args.no_save and not args.out:
        raise ConfigError("--overwrite replaces --out and kept probes, and there are neither: drop it")


def _claim_outputs(args: argparse.Namespace) -> None:
    """Every output checked before the evaluation starts (``levjepa.commands._outputs``)."""
    if args.plan:
        return
    if args.out:
        result = "a probe result (JSON)"
        claim_file(args.out, "--out", result, is_own=is_json_with("accuracy", "results"), overwrite=args.overwrite)
    if not args.no_save:
        flag = "--probes-dir" if args.probes_dir else "--probes-dir (default RUN/probes)"
        claim_folder(_probes_dir(args), flag, "probes", resumes=True)
    if args.task.startswith("index:"):  # feature stores: never inside a run, an export or a fine-tuning folder
        claim_outside_owned(_features_dir(args), "--features" if args.features else "--features (default)")
    if args.cache:
        claim_outside_owned(args.cache, "--cache")


def _features_dir(args: argparse.Namespace) -> str:
    """Where an index task's feature stores go: ``--features``, else ``features/`` beside ``--out``, else ./features."""
    return args.features or str(Path(args.out).parent / "features" if args.out else Path("features"))


def _check_kept(root: Path, tasks: list[str], probes: list[str], columns: list[str], overwrite: bool) -> None:
    """A probe kept before under the name this evaluation keeps one is replaced only with ``--overwrite``."""
    weights = [c.removeprefix("pretrained-") for c in columns]
    roots = [root] if len(columns) <= 1 else [root / w for w in weights]
    held = [b / t / p for b in roots for t in tasks for p in probes if is_classifier(b / t / p)]
    if held and not overwrite:
        more = f" (and {len(held) - 1} more)" if len(held) > 1 else ""
        raise ConfigError(
            f"{held[0]}{more}: a probe kept by an earlier evaluation; pass --overwrite to replace it, --probes-dir "
            "DIR to keep these elsewhere, --name NAME (index task) to keep them beside, or --no-save"
        )


def _main(args: argparse.Namespace) -> int:
    probes = _split_list(args.probe, probe_names(), "probe")
    _check_options(args)
    _claim_outputs(args)
    weights = ["ema", "online"] if args.weights == "both" else [args.weights]
    loaded: dict[str, LoadedEncoder] = {}
    for w in weights:
        enc = with_layers(load_encoder(args.checkpoint, weights=w, device=args.device), args.layers)  # type: ignore[arg-type]
        if enc.weights != w:  # an export keeps one set of weights: the option does not apply to it
            print(
                f"note: --weights {args.weights}: {args.checkpoint} holds one set of weights ({enc.weights}), "
                f"read as it is in place of {w}",
                file=sys.stderr,
            )
        loaded.setdefault(f"pretrained-{enc.weights}", enc)
    first = next(iter(loaded.values()))
    if not args.no_baseline:
        loaded["random-init"] = random_like(first, seed=args.baseline_seed)
    grid = args.grid or (PROTOCOLS[args.protocol].grid if args.protocol and args.budget == "full" else "budget")
    probe_cfg = apply_overrides(probe_config(args.budget, grid=grid, depth=args.probe_depth), args.set)
    bad = None
    online = False  # --train-views online (or the protocol's default): an index task only
    task: Task
    if args.protocol == "video-knn":
        return _video_knn(args, loaded)
    if args.task.startswith("index:"):
        _check_protocol_options(args)
        chosen = _train_views(args)
        online = chosen == "online"  # the reference protocol: no training store of tokens, a view every epoch
        if online and args.tokens != "full" and not args.online and args.train_views is None:
            raise ConfigError(
                f"--tokens {args.tokens}: a store's codec, and --protocol {args.protocol} trains online by default "
                "(the reference protocol: a new view every epoch, no token stored); add --train-views K to store K "
                "views of its transform in that codec, or --train-views fixed for the centre crops"
            )
        train_views = chosen if isinstance(chosen, int) else 0
        bad = BadFileReport()
        features = _features_dir(args)
        views, said = model_views(
            first, size=args.size, frames=args.frames, frame_stride=args.frame_stride, fps=args.fps
        )
        views = image_frames(views, args.image_frames, first.config.tubelet)
        said += views.image_text
        task = dataset_task(
            args.task[len("index:") :].split(","),
            protocol=args.protocol,
            views=views,
            slots=parse_slots(args.slots),
            tubelet=first.config.tubelet,
            name=args.name,
            video_root=args.video_root,
            labels_file=args.labels_file,
            batch_size=args.batch_size,
            workers=args.workers,
            train_views=train_views,
            features_dir=features,
            bad_files=bad,
            allow_shared=args.allow_shared_files,
        )
        for pair, n in task.shared.items():  # allowed: said before any feature is computed
            print(f"warning: {pair.replace('/', ' and ')} share {n} file(s); the result says so (--allow-shared-files)")
        tasks = [task.name]
        title = f"labelled index {args.task[len('index:') :]}"
        if args.protocol:
            title += f", protocol {task.protocol_text}"
        else:
            print(said)
        print(f"task: {task.name}; feature stores: {features} (reused when run again)")
        if not args.no_save and not args.plan:
            check_probe_dir(_probes_dir(args), task.name, task.paths, columns=kept_columns(loaded))
    else:
        index_only = (
            *("protocol", "video_root", "labels_file", "frames", "frame_stride", "fps", "size", "slots", "name"),
            *("train_views", "image_frames", "features"),
        )
        if any(getattr(args, k) is not None for k in index_only) or args.online or args.plan or args.allow_shared_files:
            raise ConfigError(
                "--protocol, --slots, --name, --frames, --frame-stride, --fps, --size, --online, --plan, --video-root"
                ", --train-views, --image-frames, --features, --allow-shared-files and --labels-file "
                f"apply to --task index:TRAIN,VAL[,TEST], not to --task {args.task!r} (the built-in benchmark, whose "
                "clips are the run's)"
            )
        tasks = _split_list(args.task, TASKS, "task")
        task = synthetic_splits(synthetic_config_for(first.run_config, args.synthetic), args.budget)
        title = SYNTHETIC_TITLE
    if not args.no_save and not args.plan:
        _check_kept(_probes_dir(args), tasks, probes, kept_columns(loaded), args.overwrite)
    evaluation = EvalConfig(
        tasks=tuple(tasks),
        probes=tuple(probes),
        budget=args.budget,
        probe=probe_cfg,
        seed=args.seed,
        seeds=args.seeds,
        device=args.device,
        batch_size=args.batch_size,
        cache_dir=args.cache,
        progress=True,
        title=title + _readout_title(first),
        keep_heads="none" if args.no_save else "all" if args.save_all else "best",
        tokens=args.tokens,
        online=online,
    )
    if args.plan:
        assert isinstance(task, DatasetTask)  # --plan with the built-in benchmark is refused above
        print(plan(task, first, evaluation).text())
        return 0
    on_disk = isinstance(task, DatasetTask)  # stores and probe records; the built-in benchmark: --cache at most
    kept = str(task.features_dir) if isinstance(task, DatasetTask) else args.cache  # what a rerun continues from
    with stop_now_on_signals(functools.partial(_stopped, kept, on_disk)):  # store units, probe records, caches: atomic
        result = evaluate({name: le.encoder for name, le in loaded.items()}, task, evaluation)
    if result is None:  # not rank 0: the features are done, rank 0 trains the probes
        return 0
    with StopSignals():  # the evaluation is done: a signal now waits for its results to be written
        _report(args, result, loaded, task, bad)
    return 0


# options --protocol video-knn would leave unread (None when not given)
_KNN_IGNORES = ("grid", "frames", "frame_stride", "fps", "slots", "features", "name", "image_frames", "cache")


def _video_knn(args: argparse.Namespace, loaded: dict[str, LoadedEncoder]) -> int:
    """``--protocol video-knn``: the public real-video kNN protocol (``levjepa.eval.video_knn``) of every column."""
    files = args.task[len("index:") :].split(",") if args.task.startswith("index:") else []
    if len(files) != 2:
        raise ConfigError(
            f"--protocol video-knn: --task index:GALLERY,QUERY (two labelled index files), not {args.task!r}"
        )
    if args.plan or args.online or args.train_views is not None:
        raise ConfigError("--protocol video-knn trains nothing: drop --plan, --online and --train-views")
    ignored = [f"--{k.replace('_', '-')}" for k in _KNN_IGNORES if getattr(args, k) is not None]
    ignored += [o for o, v in (("--seeds", args.seeds != 1), ("--tokens", args.tokens != "full")) if v]
    if ignored:
        raise ConfigError(
            f"{', '.join(ignored)}: --protocol video-knn reads 16 frames by linspace over each whole video at the "
            "model's size (--size), its CLS or token mean, with no probe, grid, seed or store; drop them"
        )
    gallery, names = read_labelled(files[0], video_root=args.video_root)
    queries, _ = read_labelled(files[1], video_root=args.video_root, classes=names)
    out = {}
    for name, le in loaded.items():
        size = args.size or model_preprocessing(le).size  # the model's preprocessing, unless --size
        feature: Literal["cls", "mean"] = "mean" if args.knn_feature == "mean" else "cls"
        res = video_knn(le.encoder, gallery, queries, size=size, feature=feature, device=args.device)
        print(res.table(name))
        out[name] = res.to_json()
    if args.out:  # "accuracy" and "results", as every probe result (--overwrite recognises it as one)
        accuracy = {name: {"knn": r["knn"], "centroid": r["centroid"]} for name, r in out.items()}
        result = {"protocol": "video-knn", "accuracy": accuracy, "results": out}
        write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


def _readout_title(loaded: LoadedEncoder) -> str:
    """What the caption adds for ``--layers``: the blocks read (nothing for the last block)."""
    c = loaded.config
    return "" if c.readout_layers is None else f"; encoders read at {layers_text(c.readout_layers, c.depth)}"


def _stopped(kept: str | None, probes: bool, signal_name: str) -> str:
    """What ``probe`` says when a signal stops its evaluation (``levjepa.train.preemption``): what is kept (the
    features, and with ``probes`` the probes finished), and that the same command continues from it."""
    if kept is None:
        return f"{signal_name} received: stopped during the evaluation, nothing written; the same command runs it again"
    what = "the features computed so far and the probes finished are" if probes else "the features computed so far are"
    return (
        f"{signal_name} received: stopped during the evaluation; {what} kept in {kept} (every file there is "
        "complete), and the same command continues from them"
    )


def _report(
    args: argparse.Namespace,
    result: EvalResult,
    loaded: dict[str, LoadedEncoder],
    task: Task,
    bad: BadFileReport | None,
) -> None:
    """The table, the kept probes, ``--out`` and the unreadable files of a finished evaluation."""
    result.info["encoders"] = {name: le.describe() for name, le in loaded.items()}
    for name, le in loaded.items():  # which copy each column is (the EMA copy by default)
        print(f"{name}: {le.describe()}")
    print(result.table())
    if not args.no_save:
        source = str(Path(args.checkpoint).resolve())
        for d in keep_probes(result, loaded, task, _probes_dir(args), encoder_source=source, tokens=args.tokens):
            print(f"kept probe: {d}")
    if args.out:
        out = Path(args.out)
        write_json(out, result.to_json())
        print(f"wrote {out}")
        if bad is not None:
            bad.write(out.parent / BAD_FILES)
    if bad is not None and bad.total:
        print(f"{bad.total} unreadable file(s) skipped ({bad.counts_text()})")


def _probes_dir(args: argparse.Namespace) -> Path:
    if args.probes_dir:
        return Path(args.probes_dir)
    if Path(args.checkpoint).is_dir():
        return Path(args.checkpoint) / "probes"
    return (Path(args.out).parent if args.out else Path(".")) / "probes"

"""``levjepa classify MODEL VIDEOS...``: predictions of a kept probe or a fine-tuned classifier.

``MODEL`` is a classifier directory: a probe kept by ``levjepa probe`` (``RUN/probes/<task>/<probe>``) or a
fine-tuned classifier (``levjepa finetune``'s ``OUT/best``, or its export). ``VIDEOS`` are files, folders
(recursive) or index files (``path label`` rows: the accuracy over them is printed too; a label given as a
class name is read through the classifier's class names, and a label it never saw is reported, not scored).
Every file is cut into the views the classifier was scored with (``--fps`` may change their sampling), and
their probabilities averaged (``levjepa.eval.predict``);
``--windows`` gives one prediction per window of a long video with its time span. A probe kept with
``probe --layers`` reads the encoder at the blocks it recorded (``--layers``, if given, must name them). The
top-``--top-k`` labels go to stdout as a table and, with ``--out``, to a CSV (``.csv``) or JSON Lines file (any
other name). Decoding runs in ``--workers`` processes, the model on ``--device`` (the GPU when there is one); an
unreadable file is listed at the end, not fatal — unless no file at all could be read.

``--backend onnx`` runs the classifier's export instead (``levjepa export MODEL --out DIR --format onnx``:
``DIR/classifier.onnx``, encoder and head in one graph, ``levjepa.formats.deployment.classifier_graphs``) with
onnxruntime on the CPU: the same views, the same probabilities (``tests/test_deploy_classifier.py``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import sys
from pathlib import Path

from levjepa.commands._device import add_device_argument, local_device
from levjepa.commands._extras import require_extra
from levjepa.commands._images import add_image_frames_argument, image_frames
from levjepa.commands._layers import add_layers_argument, requested_layers
from levjepa.commands._numbers import positive, whole
from levjepa.commands._outputs import claim_optional_file
from levjepa.config import ConfigError
from levjepa.data import BadFileReport, DataError
from levjepa.data.badfiles import bad_file_line
from levjepa.eval.predict import Prediction, accuracy, classifier_items, predict
from levjepa.features.compact import TokenCodec
from levjepa.formats.deployment.runner import OnnxClassifier
from levjepa.formats.reading.classifier import load_classifier, read_classifier
from levjepa.model import EncoderConfig
from levjepa.model.classifier import VideoClassifier
from levjepa.model.readout_layers import layers_text
from levjepa.weights import atomic_write_bytes

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a kept probe (RUN/probes/TASK/PROBE) or a fine-tuned classifier")
    parser.add_argument("videos", nargs="+", help="video / image files, folders or index files")
    parser.add_argument("--top-k", type=whole(1), default=5, help="labels per prediction")
    parser.add_argument("--out", default=None, help="write the predictions: .csv, else JSON Lines")
    parser.add_argument("--overwrite", action="store_true", help="replace the predictions of an earlier run at --out")
    parser.add_argument("--windows", action="store_true", help="one prediction per window of each video")
    parser.add_argument("--encoder", default=None, help="read the encoder from here (it must be the same weights)")
    parser.add_argument("--workers", type=whole(0, 1024), default=2, help="decoding processes")
    parser.add_argument("--batch-size", type=whole(1, 1 << 16), default=8, help="files per forward")
    parser.add_argument(
        "--fps", type=positive, default=None, help="frames per second instead of the views' own sampling"
    )
    add_image_frames_argument(parser, "what the probe was scored with")
    add_layers_argument(parser, "the blocks the head was trained on, which it must be")
    add_device_argument(parser)
    parser.add_argument(
        "--backend",
        choices=("torch", "onnx"),
        default="torch",
        help="torch: the classifier in PyTorch (default); onnx: MODEL is an export with classifier.onnx, run by "
        "onnxruntime (CPU)",
    )


def _row(q: Prediction) -> str:
    where = q.path if q.window is None else f"{q.path} [{q.start_time:.2f}-{q.end_time:.2f} s]"
    tops = "  ".join(f"{n} {p:.3f}" for n, p in zip(q.labels, q.probs, strict=True))
    return f"{where}\t{tops}"


def _write(path: Path, predictions: list[Prediction]) -> None:
    """The predictions as CSV or JSON Lines, written whole (atomically); a file name in any bytes as its bytes."""
    if path.suffix.lower() == ".csv":
        f = io.StringIO(newline="")
        w = csv.writer(f)
        k = max((len(q.labels) for q in predictions), default=0)
        head = ["path", "window", "start_time", "end_time", "truth"]
        w.writerow(head + [f"{x}{j + 1}" for j in range(k) for x in ("label", "prob")])
        for q in predictions:
            tops = [v for n, p in zip(q.labels, q.probs, strict=True) for v in (n, f"{p:.6f}")]
            w.writerow([q.path, q.window, q.start_time, q.end_time, q.truth, *tops])
        text = f.getvalue()
    else:
        text = "".join(json.dumps(q.to_json()) + "\n" for q in predictions)
    atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"))


def _is_predictions(path: Path) -> bool:
    """A file classify wrote: its CSV header, or JSON Lines whose first row is a prediction."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline(1 << 16).strip()
    except (OSError, UnicodeDecodeError):
        return False
    if first.startswith("path,window,start_time,end_time,truth"):
        return True
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and {"path", "labels", "probs"} <= set(row)


def _check_layers(text: str | None, config: EncoderConfig, model: str) -> None:
    """``--layers``, when given, must name the blocks the head was trained on (it reads no others)."""
    if text is None or requested_layers(text, config.depth) == config.readout_layers:
        return
    raise ConfigError(
        f"--layers {text}: {model}'s head was trained on {layers_text(config.readout_layers, config.depth)} and "
        "reads no other blocks; drop --layers (a kept probe reads the blocks it recorded), or probe again with "
        "--layers"
    )


def main(args: argparse.Namespace) -> int:
    claim_optional_file(args.out, "--out", "classify's predictions", is_own=_is_predictions, overwrite=args.overwrite)
    if args.backend == "onnx":
        require_extra("deploy", "--backend onnx", ("onnxruntime",))
    device = local_device(args.device)
    model: VideoClassifier | OnnxClassifier
    if args.backend == "onnx":
        if args.encoder is not None or args.layers is not None:
            option = "--encoder" if args.encoder is not None else "--layers"
            raise ConfigError(f"{option}: the onnx backend runs the encoder exported into classifier.onnx")
        model = OnnxClassifier(args.model)
        rec, tubelet, device = read_classifier(args.model), model.tubelet, "cpu"
        described = f"{args.model}/classifier.onnx (onnxruntime, {model.record['dtype']}" + (
            f", int8 {model.record['int8']['method']})" if model.record["quantize"] == "int8" else ")"
        )
    else:
        clf = load_classifier(args.model, encoder=args.encoder, device=device)
        model, rec, tubelet, described = clf.model, clf.record, clf.encoder.encoder.cfg.tubelet, clf.encoder.describe()
        _check_layers(args.layers, clf.encoder.config, args.model)
    items, unknown = classifier_items(args.videos, rec.labels)
    if not items:
        raise DataError(f"missing: no video or image in {' '.join(args.videos)}")
    bad = BadFileReport(warn=False)  # listed at the end
    views = rec.protocol if args.fps is None else dataclasses.replace(rec.protocol, fps=args.fps)
    views = image_frames(views, args.image_frames, tubelet)
    given = [o for o, v in (("--fps", args.fps), ("--image-frames", args.image_frames)) if v is not None]
    origin = "the classifier's own" if not given else f"{' and '.join(given)} as given"
    print(
        f"{args.model}: {rec.head.kind} head on {described}; {len(rec.labels)} classes; "
        f"views: {views.describe()} ({origin})",
        file=sys.stderr,
    )
    predictions = []
    for q in predict(
        model,
        rec.labels,
        views,
        items,
        top_k=args.top_k,
        workers=args.workers,
        device=device,
        windows=args.windows,
        batch_files=args.batch_size,
        bad=bad,
        codec=TokenCodec.parse(rec.tokens),
    ):
        predictions.append(q)
        print(_row(q))
    if not predictions:
        raise DataError(f"unreadable: none of the {len(items)} file(s) could be read ({bad.counts_text()})")
    acc = accuracy(predictions)
    if acc is not None:
        print(f"accuracy {acc:.1f} % over {sum(q.truth is not None for q in predictions)} labelled prediction(s)")
    if unknown:
        names = sorted(set(unknown.values()))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        print(
            f"{len(unknown)} file(s) labelled with a class the classifier never saw ({shown}): predicted, not "
            f"scored (its classes: {', '.join(rec.labels[:8])}{' ...' if len(rec.labels) > 8 else ''})"
        )
    if args.out:
        _write(Path(args.out), predictions)
        print(f"wrote {args.out}", file=sys.stderr)
    if bad.total:
        print(f"{bad.total} unreadable file(s) skipped:", file=sys.stderr)
        for path, reason in bad.files.items():
            print(f"  {bad_file_line(path, reason)}", file=sys.stderr)
    return 0

"""What an evaluation returns: the accuracy of every encoder × task × probe, its table and its JSON."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from levjepa.data import clip_augment
from levjepa.eval.config import PROBE_LABELS
from levjepa.eval.knn import KnnResult
from levjepa.eval.trainer import GridResult

__all__ = ["EvalResult", "Result"]

Result = GridResult | KnnResult


@dataclass
class EvalResult:
    """Accuracy (%) of every encoder × task × probe; ``results[encoder][task][probe]`` keeps the whole grid."""

    encoders: list[str]
    tasks: list[str]
    probes: list[str]
    results: dict[str, dict[str, dict[str, Result]]]
    chance: dict[str, float]  # task -> majority-class accuracy (%) of the reported split
    info: dict[str, Any] = field(default_factory=dict)

    def accuracy(self, encoder: str, task: str, probe: str) -> float:
        """The reported accuracy; with several probe seeds, its mean over them."""
        r = self.results[encoder][task][probe]
        return r.mean_reported if isinstance(r, GridResult) else r.reported

    def cell(self, encoder: str, task: str, probe: str) -> str:
        """The table's cell: the accuracy, ``mean ± sd`` over probe seeds when there are several."""
        r = self.results[encoder][task][probe]
        sd = r.sd_reported if isinstance(r, GridResult) else None
        return f"{self.accuracy(encoder, task, probe):.1f}" + ("" if sd is None else f" ± {sd:.1f}")

    def best_on_eval_cell(self, encoder: str, task: str, probe: str) -> str:
        """V-JEPA 2's number for a trained probe: the best head on the evaluation split (mean ± sd over seeds)."""
        r = self.results[encoder][task][probe]
        assert isinstance(r, GridResult)
        accs = r.seed_best_on_eval
        m = sum(accs) / len(accs)
        return f"{m:.1f}" if len(accs) == 1 else f"{m:.1f} ± {statistics.stdev(accs):.1f}"

    def caption(self) -> str:
        i = self.info
        sizes = "/".join(str(v) for v in i.get("split_sizes", {}).values())
        split = "test" if i.get("has_test", True) else "val (no test split given)"
        tokens, stored = i.get("tokens", "full"), ""
        if "attentive" in self.probes and tokens != "full":
            stored = f"; the attentive probe reads {tokens} tokens (a compact store)"
        if "attentive" in self.probes and i.get("online"):
            stored = "; the attentive probe's tokens encoded every epoch (online, none stored)"
        shared = i.get("shared_files") or {}
        if shared:  # --allow-shared-files: the splits share files, and the caption says so
            pairs = ", ".join(f"{pair} {n}" for pair, n in shared.items())
            stored += f"; SPLITS SHARE FILES ({pairs}): the reported accuracy is optimistic"
        seeds, seed = int(i.get("seeds", 1)), i.get("seed", 0)
        own = "init, batch order and training views" if i.get("train_transform") else "init and batch order"
        seeds_text = (
            f"1 probe seed ({seed})"
            if seeds == 1
            else f"mean ± sd over {seeds} probe seeds {seed}…{int(seed) + seeds - 1} (one pass, each its own {own}; "
            "kNN has no seed)"
        )
        grid = ""
        if i.get("grid") == "vjepa2":
            grid = (
                f"; V-JEPA 2's grid (20 heads, its schedules): each probe has two rows, levjepa's (the head chosen on"
                f" val, read on {split.split(' ')[0]}) and V-JEPA 2's report (the best head on {split.split(' ')[0]}"
                " itself, optimistic)"
            )
        elif "attentive" in self.probes:
            grid = "; levjepa's grid and schedule (V-JEPA 2's: --grid vjepa2)"
        return (
            f"Frozen-encoder accuracy (%) on {split} of the probe chosen on val — {i.get('title', 'benchmark')}; "
            f"image source: {i.get('image_source')}; clips {i.get('clip')}; train/val/test {sizes} clips; "
            f"budget {i.get('budget')}{self._recipe()}; {seeds_text}; tokens {tokens}{stored}; training views: "
            f"{self._views()}{grid}; chance = the majority class's share of that split."
        )

    def _views(self) -> str:
        """The probes' training views and which protocol they make: the reference (V-JEPA's frozen evaluation:
        a new augmented view every epoch), its transform on K stored views, or levjepa's fixed centre crops."""
        i = self.info
        if "train_views" not in i:  # clips in memory (the built-in benchmark): encoded as they are, once
            return "the clips as given, one fixed view each (no training transform)"
        views = i["train_views"]
        if i.get("train_transform") is None:
            if i.get("online"):  # online views feed the attentive probe; no probe of this table reads tokens
                return (
                    f"{views} (the probes here read CLS or the mean, from the store; online views are the attentive's)"
                )
            return f"{views} (levjepa's cheap protocol, not the reference's augmented views: --train-views online)"
        what = (
            "the reference protocol"
            if i.get("online")
            else "reused over the epochs: the reference transform, where the reference protocol draws a view an epoch"
        )
        described = clip_augment.DESCRIPTION if i["train_transform"] == clip_augment.NAME else i["train_transform"]
        others = "" if not i.get("online") or self.probes == ["attentive"] else "; the other probes: fixed centre crops"
        return f"{views} {what} ({described}){others}"

    def _recipe(self) -> str:
        """How the attentive probes trained, where the table has them: epochs and the rule val chose by."""
        p = self.info.get("probe_config")
        if "attentive" not in self.probes or not p:
            return ""
        rule = "loss" if p.get("select") == "loss" else "accuracy"
        heads = f"{len(p.get('lrs', ()))} lr × {len(p.get('weight_decays', ()))} wd heads, "
        return f" (attentive: {heads}{p.get('epochs')} epochs, chosen by val {rule})"

    def table(self) -> str:
        head = ["task", "probe", *self.encoders, "chance"]
        lines = [self.caption(), "", "| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
        for task in self.tasks:
            for probe in self.probes:
                label = PROBE_LABELS.get(probe, probe)
                if probe == "attentive" and self.info.get("probe_depth", 1) != 1:
                    label = "attentive4"
                accs = [self.cell(e, task, probe) for e in self.encoders]
                trained = all(isinstance(self.results[e][task][probe], GridResult) for e in self.encoders)
                if not (trained and self.info.get("grid") == "vjepa2"):
                    lines.append(f"| {task} | {label} | " + " | ".join(accs) + f" | {self.chance[task]:.1f} |")
                    continue
                best = [self.best_on_eval_cell(e, task, probe) for e in self.encoders]
                split = "test" if self.info.get("has_test", True) else "val"
                for what, cells in (("chosen on val (levjepa)", accs), (f"best head on {split} (V-JEPA 2)", best)):
                    lines.append(f"| {task} | {label}, {what} | " + " | ".join(cells) + f" | {self.chance[task]:.1f} |")
        if "seconds" in self.info:
            lines.append("")
            lines.append(f"({self.info['seconds']:.0f} s on {self.info.get('device', 'cpu')}.)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "info": self.info,
            "chance": self.chance,
            "accuracy": {
                e: {t: {p: self.accuracy(e, t, p) for p in self.probes} for t in self.tasks} for e in self.encoders
            },
            "results": {
                e: {t: {p: r.to_json() for p, r in tp.items()} for t, tp in te.items()}
                for e, te in self.results.items()
            },
        }

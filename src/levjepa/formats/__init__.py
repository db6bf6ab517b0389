"""Weights in and out, in four rooms by job:

* ``reading/`` — what an encoder is read from: ``load.py`` (levjepa runs, checkpoints and exports into a frozen
  encoder: ``levjepa.load``; what ``model.init_from`` starts a run from) · ``official.py`` (the official LeVJEPA
  checkpoints, converted so levjepa's encoder computes the official function: ``levjepa import``) ·
  ``validation.py`` (an import against the official outputs) · ``origin.py`` (a local folder or a hub repo id,
  revisions and SHA-256) · ``views.py`` (a reader's clips from what the model records) · ``classifier.py`` (the
  one classifier record: a kept probe or a fine-tuned classifier, read back into ``levjepa.model.classifier``);
* ``writing/`` — what levjepa writes: ``export.py`` (the Hugging Face hub layout, ``levjepa export``, a
  classifier's included) · ``card.py`` (the model card: facts, then text) · ``finetuned.py`` (where fine-tuning's
  encoder and head start, and its ``best/``);
* ``transformers/`` — levjepa in transformers' and huggingface_hub's terms: ``hub.py`` (``LeVJEPAModel``,
  ``from_pretrained``, ``push_to_hub``) · ``config.py`` (``AutoConfig``) · ``auto.py`` (``AutoModel`` /
  ``AutoModelForVideoClassification``, the released layout without remote code) · ``video_processor.py``
  (``AutoVideoProcessor``, the pipeline's frames) · ``outputs.py`` (the official outputs and transformers'
  input/output conventions);
* ``deployment/`` — graphs that run without levjepa: ``graphs.py`` (the clip encoder and the streaming step, ONNX
  or ``torch.export``) · ``classifier_graphs.py`` (encoder + head) · ``frame_attention.py`` · ``quantize.py``
  (int8: dynamic, or static calibrated on clips) · ``runner.py`` (the graphs run by onnxruntime).

Evaluation, extraction and the commands read weights only through this package.
"""

from __future__ import annotations

from levjepa.formats.reading.load import (
    LoadedEncoder,
    load,
    load_encoder,
    load_init_weights,
    random_encoder,
    random_like,
)

__all__ = ["LoadedEncoder", "load", "load_encoder", "load_init_weights", "random_encoder", "random_like"]

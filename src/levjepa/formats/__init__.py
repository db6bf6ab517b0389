"""Weights in and out: every format an encoder is read from or written to.

* ``load.py`` — levjepa run directories, checkpoints and exports (old and hub layout) into a frozen encoder
  (``levjepa.load``), and what ``model.init_from`` starts a run from;
* ``official.py`` — the official LeVJEPA checkpoints (the released checkpoint's schema and layout, hub repo
  folders, Lightning ``.ckpt``), converted so levjepa's encoder computes the official function
  (``levjepa import``);
* ``origin.py`` — where weights come from: a local folder or a hub repo id (huggingface_hub, its cache
  offline), the revision and the weights file's SHA-256 (pinned releases checked);
* ``export.py`` — the Hugging Face hub layout (``levjepa export``), a classifier's included;
* ``hub.py`` — ``LeVJEPAModel``, ``LeVJEPAForVideoClassification``, ``from_pretrained`` and ``push_to_hub``,
  and the registration with transformers (``transformers_config.py``: ``AutoConfig``; ``transformers_auto.py``:
  ``AutoModel`` / ``AutoModelForVideoClassification``, the released layout without remote code);
* ``outputs.py`` — the official outputs and transformers' input/output conventions, computed once;
* ``deploy.py`` — the clip encoder and the streaming step as ONNX or ``torch.export`` graphs;
* ``classifier.py`` — a classifier directory (a kept probe or a fine-tuned classifier: head, labels,
  protocol, the fingerprint of the encoder it reads), read back into ``levjepa.model.classifier``.

Evaluation, extraction and the commands read weights only through this package.
"""

from __future__ import annotations

from levjepa.formats.load import LoadedEncoder, load, load_encoder, load_init_weights, random_encoder, random_like

__all__ = ["LoadedEncoder", "load", "load_encoder", "load_init_weights", "random_encoder", "random_like"]

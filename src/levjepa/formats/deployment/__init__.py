"""Deployment graphs: written (``graphs.py``, ``classifier_graphs.py``, ``quantize.py``) and run by onnxruntime
(``runner.py``); ``levjepa.formats`` says what each module holds."""

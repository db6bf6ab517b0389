"""Tools: FLOPs accounting (``flops.py``, the ``levjepa flops`` command)."""
